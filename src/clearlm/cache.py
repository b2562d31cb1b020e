"""The cache folder of assembled models: how much it holds, and removing one alias's file.

``clearlm pull`` writes ``<file>.gguf`` and its ``<file>.gguf.sha256`` sidecar (see
:mod:`clearlm.pull`); a compact load may keep a packed copy in ``packed/``
(:mod:`clearlm.quant.pack_cache`); ``clearlm rm ALIAS`` deletes all three. The part packages
pip installed stay where pip put them; :func:`packages_size` says how much they hold, and the
CLI prints the ``pip uninstall`` that removes them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from clearlm.errors import ModelNotFoundError
from clearlm.models import (
    ModelAlias,
    cached_path,
    default_cache_dir,
    get_alias,
    package_dir,
)


def cache_usage(cache_dir: str | os.PathLike[str] | None = None) -> tuple[int, int]:
    """(bytes, number of model files) in the cache folder; sidecars and temporary files count
    in the bytes. (0, 0) when the folder does not exist."""
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if not folder.is_dir():
        return 0, 0
    files = [f for f in folder.iterdir() if f.is_file()]
    return sum(f.stat().st_size for f in files), sum(f.suffix == ".gguf" for f in files)


def packages_size(alias: ModelAlias) -> int:
    """Bytes held by the alias's installed packages (0 for those not installed)."""
    total = 0
    for module in alias.modules:
        folder = package_dir(module)
        if folder is not None:
            total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return total


def remove(alias_name: str, cache_dir: str | os.PathLike[str] | None = None) -> tuple[Path, int]:
    """Delete an assembled alias's file and its sidecar from the cache.

    Args:
        alias_name: a key of ALIASES (a misspelling gets a suggestion).
        cache_dir: the cache folder; None means ``$CLEARLM_CACHE`` or ``~/.cache/clearlm``.

    Returns:
        (the removed file's path, bytes freed).

    Raises:
        ModelNotFoundError: unknown alias; the alias's file lives inside a pip package (the
            message gives the ``pip uninstall``); or it is not in the cache.
    """
    alias = get_alias(alias_name)
    if alias.kind == "file":
        raise ModelNotFoundError(
            f"{alias.name} is not in the cache: its file ships inside the pip package "
            f"{alias.packages[0]}; remove it with: pip uninstall {alias.packages[0]}"
        )
    path = cached_path(alias, cache_dir)
    if not path.is_file():
        raise ModelNotFoundError(f"{alias.name} is not in the cache ({path.parent}); nothing to do")
    freed = 0
    for f in (path, path.with_name(path.name + ".sha256"), *packed_copies(path.stem, cache_dir)):
        if f.is_file():
            freed += f.stat().st_size
            f.unlink()
    return path, freed


def packed_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where compact loads keep packed copies of GGUF files (clearlm.quant.pack_cache): the
    cache folder's ``packed`` folder (None: ``$CLEARLM_CACHE`` or ``~/.cache/clearlm``)."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "packed"


def packed_copies(stem: str, cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The packed copies of GGUF files called ``<stem>.gguf`` (from any folder):
    ``<stem>-<16 hex>.safetensors`` in :func:`packed_dir`."""
    folder = packed_dir(cache_dir)
    if not folder.is_dir():
        return []
    name = re.compile(re.escape(stem) + r"-[0-9a-f]{16}\.safetensors")
    return sorted(f for f in folder.iterdir() if name.fullmatch(f.name))
