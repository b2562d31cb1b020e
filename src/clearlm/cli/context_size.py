"""``-c/--ctx-size N`` (llama.cpp's spelling) for generate, chat and run: the tokens one answer's
context may hold, prompt and generated together, at most the model's context length.

A prompt longer than N is refused before the weights are read (ContextLengthError, exit 6), and
generation stops when prompt + answer reach N, with finish reason ``context_length`` as at the
model's own limit; the KV cache is sized for that many positions, no more. 0 (the default) is
the model's context length; an N past it is capped, with a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from clearlm.cli.app import err

if TYPE_CHECKING:
    from clearlm.api.model import Model
    from clearlm.generation.loop import GenerationResult
    from clearlm.sampling.chain import SamplingParams

CtxSize = Annotated[
    int,
    typer.Option(
        "--ctx-size",
        "-c",
        min=0,
        help="Most tokens the context holds, prompt + generated (llama.cpp's -c): a longer "
        "prompt is refused, generation stops there. 0: the model's context length.",
    ),
]


def context_limit(context_length: int, ctx_size: int) -> tuple[int, str]:
    """(tokens a generation may fill, what sets that bound, as error messages name it):
    ``ctx_size`` when it is below the model's ``context_length``, else the latter (0: unset)."""
    if 0 < ctx_size < context_length:
        return ctx_size, "the context size (-c)"
    return context_length, "the model's context length"


def check_prompt(n_prompt: int, context_length: int, ctx_size: int) -> None:
    """Raise ContextLengthError unless the prompt leaves room for a token within -c (or the
    model's context length); the message names which bound it hit."""
    from clearlm.generation.loop import check_fits

    limit, what = context_limit(context_length, ctx_size)
    check_fits(n_prompt, limit, what=what)


def warn_past_model(context_length: int, ctx_size: int) -> None:
    """One warning line when ``-c`` asks for more than the model holds (it is capped)."""
    if ctx_size > context_length:
        err.print(f"[yellow]warning: -c {ctx_size} is past the model's context length; the "
                  f"context holds {context_length} tokens[/]", soft_wrap=True)


def generate_within(
    model: Model,
    ids: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str],
    on_text: Callable[[str], None] | None,
    ctx_size: int = 0,
    grammar: Any = None,
    drafter: Any = None,
) -> tuple[GenerationResult, int]:
    """Generate from prompt ``ids`` within ``-c``'s context (see the module docstring);
    ``grammar``: a GrammarState for structured output, ``drafter``: speculative decoding
    (clearlm.api.speculative.run_generate), or None.

    Returns:
        (the result, the most tokens it was allowed: max_new_tokens, or fewer where the context
        ends first; its finish reason is "context_length" when that is where it stopped).

    Raises:
        ContextLengthError: the prompt is empty or leaves no room in the context.
    """
    from clearlm.api.speculative import run_generate

    check_prompt(len(ids), model.config.context_length, ctx_size)
    limit = context_limit(model.config.context_length, ctx_size)[0]
    n_new = min(max_new_tokens, limit - len(ids))
    result = run_generate(model, ids, params, n_new, stop, on_text, drafter, grammar)
    if n_new < max_new_tokens and result.finish_reason == "length":
        result.finish_reason = "context_length"  # the context ended it, not -n
    return result, n_new
