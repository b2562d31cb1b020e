"""The Typer app, the stderr console and the options every command shares.

Command modules import these from here, and ``clearlm.cli`` imports the command modules to
register them: the package's ``__init__`` is then the only module that imports them all, and
no command module imports it back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
import typer.core
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="markdown",  # a docstring's lines join into paragraphs, as in Markdown
    help="Run real open-weight LLMs through a readable, from-scratch Transformer.",
)
err = Console(stderr=True, highlight=False)


def _flag_type_hidden(display: Callable[..., str | None]) -> Callable[..., str | None]:
    """typer's help shows ``<bool>`` beside every flag (--help, --json): a flag takes no value,
    so its type column stays empty."""

    def display_type_rich(self: typer.core.TyperOption, ctx: object) -> str | None:
        return None if self.is_flag else display(self, ctx)

    return display_type_rich


typer.core.TyperOption.display_type_rich = _flag_type_hidden(  # type: ignore[method-assign]
    typer.core.TyperOption.display_type_rich
)

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="A .gguf file, a Hugging Face folder, or an alias (default smollm2-135m-instruct).",
    ),
]
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def _one_of(names: tuple[str, ...]):
    """A typer callback: the option must name one of `names` (None: not given, kept);
    anything else is a usage error (exit 2) listing them."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in names:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(names)}")
        return value

    return check


_check_dtype = _one_of(DTYPE_NAMES)


DType = Annotated[
    str,
    typer.Option(callback=_check_dtype, help="Parameter dtype: float32, bfloat16 or float16."),
]


WEIGHT_NAMES = ("compact", "float32")


_check_weights = _one_of(WEIGHT_NAMES)


Weights = Annotated[
    str | None,
    typer.Option(
        callback=_check_weights,
        help="How a GGUF's quantized matrices are held: compact (packed as in the file, "
        "default) or float32 (dequantized: the exact reference, 4-8x the memory). Folders "
        "and F32/F16 tensors are float either way.",
        show_default=False,
    ),
]


PRECISION_NAMES = ("highest", "medium")


_check_precision = _one_of(PRECISION_NAMES)


Precision = Annotated[
    str,
    typer.Option(
        "--matmul-precision",
        callback=_check_precision,
        help="highest: exact float32 (default). medium: prompts multiply in bfloat16 with "
        "float32 sums (about 2x faster prefill on CPUs with AMX; not exact, slower without "
        "bfloat16 units). Decode is unchanged.",
    ),
]


ACTIVATION_NAMES = ("float32", "int8")


_check_activations = _one_of(ACTIVATION_NAMES)


Activations = Annotated[
    str,
    typer.Option(
        callback=_check_activations,
        help="float32: compact layers decode with exact float32 inputs (default). int8: "
        "rounded to int8 per block of 32 and multiplied in integers (AVX-512 VNNI or AVX2), as "
        "llama.cpp does: faster decode, not exact. Compact weights only.",
    ),
]


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
