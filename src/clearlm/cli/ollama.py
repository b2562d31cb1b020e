"""ollama's spellings: ``clearlm run [MODEL] [MESSAGE]`` is ``clearlm chat`` with the model as
the first argument (``ollama run MODEL [PROMPT]``), and ``clearlm list`` is ``clearlm models``.

``run`` takes every option of ``chat`` (its parameters are chat's, with MODEL put first, so an
option added to chat is run's too); with ``-m`` given, a single argument is the message.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from clearlm.cli.app import app
from clearlm.cli.generate import chat
from clearlm.cli.manage import models

ModelArg = Annotated[
    str | None,
    typer.Argument(
        metavar="MODEL",
        help="A .gguf file, a Hugging Face folder or an alias (default smollm2-135m-instruct).",
        show_default=False,
    ),
]


def run(model_arg: str | None = None, **options: Any) -> None:
    """``clearlm chat`` with MODEL first. Raises typer.BadParameter (exit 2) when both MODEL
    and --model name a model."""
    message = options.pop("message")
    if model_arg is not None and options["model"] is not None:
        if message is not None:
            raise typer.BadParameter("give the model once: as MODEL or as --model")
        model_arg, message = None, model_arg  # `run -m X "hi"`: the one argument is the message
    options["model"] = options["model"] or model_arg
    chat(message=message, **options)


_chat = inspect.signature(chat, eval_str=True)  # typer reads run's options from this signature
_first = inspect.Parameter(
    "model_arg", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=ModelArg
)
run.__signature__ = _chat.replace(parameters=[_first, *_chat.parameters.values()])  # type: ignore[attr-defined]

app.command(
    "run",
    help="Same as `clearlm chat`, with the model first (ollama's `run MODEL [PROMPT]`): "
    "`clearlm run smollm2-135m-instruct` opens a conversation, `clearlm run MODEL \"Hi\"` "
    "answers once. Every option of chat.",
)(run)
app.command(
    "list", help="Same as `clearlm models` (ollama's spelling): the aliases and the GGUF files "
    "in the cache.",
)(models)  # fmt: skip
