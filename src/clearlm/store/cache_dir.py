"""The cache folder of assembled models: how much it holds, and removing one alias's file.

``clearlm pull`` writes ``<file>.gguf`` and its ``<file>.gguf.sha256`` sidecar (see
:mod:`clearlm.store.pull`); a compact load may keep a packed copy in ``packed/``
(:mod:`clearlm.loading.compact.pack_cache`); ``clearlm rm ALIAS`` deletes all three. The part
packages
pip installed stay where pip put them; :func:`packages_size` says how much they hold, and the
CLI prints the ``pip uninstall`` that removes them.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

from clearlm.errors import ModelNotFoundError
from clearlm.store.catalog import (
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
    freed = remove_stale_copies(cache_dir)  # those of files already gone, too
    if not path.is_file():
        raise ModelNotFoundError(f"{alias.name} is not in the cache ({path.parent}); nothing to do")
    for f in (*packed_copies(path, cache_dir), path, path.with_name(path.name + ".sha256")):
        if f.is_file() or f.is_symlink():
            freed += f.lstat().st_size  # a symlinked entry frees only the link
            f.unlink()
    return path, freed


def packed_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where compact loads keep packed copies of GGUF files (clearlm.loading.compact.pack_cache):
    the
    cache folder's ``packed`` folder (None: ``$CLEARLM_CACHE`` or ``~/.cache/clearlm``)."""
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "packed"


COPY_NAME = re.compile(r".+-[0-9a-f]{16}\.safetensors")  # <file stem>-<key>.safetensors
_TMP_NAME = re.compile(r".+-[0-9a-f]{16}\.safetensors\.(\d+)\.tmp")  # ... .<writer's pid>.tmp


def copy_metadata(copy: Path, key: str) -> str | None:
    """One string of a packed copy's metadata (its safetensors header: an 8-byte little-endian
    length, then JSON), or None if unreadable or absent."""
    try:
        with open(copy, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n)) if n < 1 << 26 else {}
        value = header["__metadata__"][key]
        return value if isinstance(value, str) else None
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def copy_source(copy: Path) -> str | None:
    """The real path of the GGUF file a packed copy was made from (``clearlm.source``), or None
    if unreadable."""
    return copy_metadata(copy, "clearlm.source")


def packed_copies(source: str | os.PathLike[str],
                  cache_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """The packed copies made from the GGUF file at ``source`` (any version of it)."""
    folder, real = packed_dir(cache_dir), os.path.realpath(source)
    if not folder.is_dir():
        return []
    return sorted(f for f in folder.iterdir()
                  if COPY_NAME.fullmatch(f.name) and copy_source(f) == real)


def remove_stale_copies(cache_dir: str | os.PathLike[str] | None = None) -> int:
    """Delete what no load will use again: packed copies whose GGUF file is gone (or whose
    header cannot be read) and the temporary files of writers that are no longer running (a
    killed load). Returns the bytes freed."""
    folder, freed = packed_dir(cache_dir), 0
    if not folder.is_dir():
        return 0
    for f in folder.iterdir():
        tmp = _TMP_NAME.fullmatch(f.name)
        if COPY_NAME.fullmatch(f.name):
            source = copy_source(f)
            stale = source is None or not os.path.isfile(source)
        else:
            stale = tmp is not None and not _running(int(tmp.group(1)))
        if stale and f.is_file():
            freed += f.stat().st_size
            f.unlink(missing_ok=True)
    return freed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or not a pid: leave it alone
    return True
