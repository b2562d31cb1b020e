"""The Typer app, the stderr console and the options every command shares.

Command modules import these from here, and ``clearlm.cli`` imports the command modules to
register them: the package's ``__init__`` is then the only module that imports them all, and
no command module imports it back.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run real open-weight LLMs through a readable, from-scratch Transformer.",
)
err = Console(stderr=True, highlight=False)

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="A .gguf file, a Hugging Face folder, or an alias (default smollm2-135m-instruct).",
    ),
]
DType = Annotated[str, typer.Option(help="Parameter dtype: float32, bfloat16 or float16.")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"clearlm {version('clearlm')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("clearlm (not installed)")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Run real open-weight LLMs through a readable, from-scratch Transformer."""
