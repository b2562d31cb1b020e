"""Compact loading: a GGUF's block-quantized matrices kept packed as in the file.

``load.py`` builds the model from the file (the default ``weights="compact"`` path),
``from_file.py`` reads a tensor's blocks into the kernel's tile layout, ``pack_cache.py`` keeps
the packed copy on disk and maps it the next time, ``swap.py`` turns a float32 model's layers
into compact ones from the same file, ``half.py`` keeps F16 / BF16 matrices 16-bit (GGUF and
Hugging Face folders alike).

Layered above :mod:`clearlm.quant` (the compact Linear, its packing and kernels, which know
nothing of files) and the GGUF reader in :mod:`clearlm.loading`.
"""
