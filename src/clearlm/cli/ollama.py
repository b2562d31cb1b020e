"""ollama's spellings: ``clearlm run [MODEL] [MESSAGE]`` is ``clearlm chat`` with the model as
the first argument (``ollama run MODEL [PROMPT]``), and ``clearlm list`` is ``clearlm models``.

``run`` takes every option of ``chat`` (its parameters are chat's, with MODEL put first, so an
option added to chat is run's too); with ``-m`` given, a single argument is the message. A
first argument that reads like a message and names no model (``run "Hi"``) is refused with a
hint that the model comes first.
"""

from __future__ import annotations

import inspect
import shlex
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
    if model_arg is not None and not model_like(model_arg):
        check_model_first(model_arg)
    options["model"] = options["model"] or model_arg
    chat(message=message, **options)


def model_like(name: str) -> bool:
    """Whether ``name`` could be an alias or a path: no whitespace, and a ``-``, ``.``, ``/``,
    ``_``, ``:`` or digit in it (``smollm2-135m-instruct``, ``model.gguf``; not ``Hi``)."""
    return not any(c.isspace() for c in name) and any(c in "-./_:" or c.isdigit() for c in name)


def check_model_first(name: str) -> None:
    """Resolve ``name`` (which looks like a message) as a model; when it names none, raise the
    same ModelNotFoundError with a hint that ``run`` takes the model first (ollama users often
    write ``clearlm run "Hi"``)."""
    from clearlm.errors import ModelNotFoundError
    from clearlm.store.catalog import resolve_model

    try:
        resolve_model(name)
    except ModelNotFoundError as e:
        raise ModelNotFoundError(
            f"{e}; `run` takes the model first: clearlm run MODEL [PROMPT] "
            f"(the default model: clearlm chat {shlex.quote(name)})"
        ) from None


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
