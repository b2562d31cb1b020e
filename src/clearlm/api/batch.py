"""``Model.generate`` / ``Model.stream`` for a list of prompts: the arguments, row by row.

A setting given once applies to every row; a list (or tuple) with one entry per prompt gives
each row its own: ``max_new_tokens=[8, 32]``, ``seed=[1, 2]``, ``temperature=[0, 0.7]``,
``params=[SamplingParams(...), None]``, ``stop=[["\\n"], None]`` (for ``stop``, a list of
strings is one shared set of stop strings; per-row stops are a list of lists or None).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from clearlm.engine.batch import generate_batch, stream_batch
from clearlm.errors import ClearLMError, PromptTypeError, SamplingParamsError
from clearlm.generation.loop import Chunk, GenerationResult
from clearlm.generation.stops import check_stop
from clearlm.model.transformer import Transformer
from clearlm.sampling.defaults import GENERATE_DEFAULTS
from clearlm.sampling.grammar import compile_response_format
from clearlm.sampling.params import SamplingParams
from clearlm.tokenizer import Tokenizer


class Model(Protocol):
    """What the batch path reads from a :class:`clearlm.api.model.Model` (named by its
    members, so that this module, which model.py imports, does not import model.py)."""

    transformer: Transformer
    tokenizer: Tokenizer

    def encode(self, prompt: Any) -> list[int]: ...

    def sampling_params(
        self,
        params: SamplingParams | None = None,
        fallback: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> SamplingParams: ...


PROMPT = str | bytes | bytearray | list | tuple  # one prompt: text, or token ids


def is_batch(prompt: Any) -> bool:
    """Whether ``prompt`` is a list of prompts (texts, or lists of token ids) rather than one.

    A list whose first item is a prompt is read as a list of prompts; one whose first item is
    not (an int) as one prompt's token ids, which ``Model.encode`` checks.

    Raises:
        PromptTypeError: an empty list or tuple (no prompt, and no token ids either), or a list
            of prompts holding something else (``["a", 5]``: the first such item named, with
            its index and type).
    """
    if not isinstance(prompt, list | tuple):
        return False
    if not prompt:
        raise PromptTypeError(
            "the list of prompts is empty; give at least one prompt (text or token ids)"
        )
    if not isinstance(prompt[0], PROMPT):
        return False
    for i, p in enumerate(prompt):
        if not isinstance(p, PROMPT):
            raise PromptTypeError(
                f"item {i} is {p!r} ({type(p).__name__}) in the list of prompts, not a prompt; "
                "give each prompt as text (str) or a list of token ids"
            )
    return True


def row_values(value: Any, n: int, name: str) -> list[Any]:
    """One value per row: a list/tuple of n values as given, else the value n times.

    Raises SamplingParamsError for a list of another length."""
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise SamplingParamsError(f"{name}: {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n


def row_stops(stop: Any, n: int) -> list[list[str]]:
    """Stop strings per row: shared (None, a string, a list of strings) or one entry per row
    (a list of n lists / None). Raises SamplingParamsError for a bad stop."""
    if (
        isinstance(stop, list | tuple)
        and stop
        and all(s is None or isinstance(s, list | tuple) for s in stop)
    ):
        return [check_stop(s) for s in row_values(stop, n, "stop")]
    return [check_stop(stop)] * n


def prepare(
    model: Model,
    prompts: Sequence[Any],
    max_new_tokens: Any,
    stop: Any,
    params: Any,
    sampling: dict[str, Any],
    response_format: Any = None,
) -> tuple[list[list[int]], list[Any], list[int], list[list[str]], list[str | None]]:
    """Encode every prompt and resolve every row's settings (the single-prompt rules per row:
    params, or keywords over generation_config.json over GENERATE_DEFAULTS).

    Raises PromptTypeError / ClearLMError (a bad prompt: the message starts with its index,
    ``prompt 2: token id 999 is outside the vocabulary [0, 64)``), SamplingParamsError (a bad
    setting, or a response_format: one for all rows, or a list with one per row)."""
    n = len(prompts)
    ids = []
    for i, p in enumerate(prompts):
        try:
            ids.append(model.encode(p))
        except ClearLMError as e:  # say which prompt of the batch (as batch_generate does)
            raise type(e)(f"prompt {i}: {e}") from None
    keys = {k: row_values(v, n, k) for k, v in sampling.items()}
    rows = [
        model.sampling_params(p, GENERATE_DEFAULTS, **{k: v[i] for k, v in keys.items()})
        for i, p in enumerate(row_values(params, n, "params"))
    ]
    grammars = [
        compile_response_format(f) for f in row_values(response_format, n, "response_format")
    ]
    limits = row_values(max_new_tokens, n, "max_new_tokens")
    return ids, rows, limits, row_stops(stop, n), grammars


def generate_prompts(
    model: Model,
    prompts: Sequence[Any],
    max_new_tokens: Any,
    stop: Any,
    params: Any,
    on_text: Any,
    sampling: dict[str, Any],
    response_format: Any = None,
) -> list[GenerationResult]:
    """``model.generate([...])``: one GenerationResult per prompt, in order.

    Raises SamplingParamsError for on_text (use ``model.stream([...])`` to see text as it comes)
    and as :func:`prepare`; ContextLengthError for an empty or too long prompt."""
    if on_text is not None:
        raise SamplingParamsError("on_text takes one prompt's text; stream a batch instead")
    args = prepare(model, prompts, max_new_tokens, stop, params, sampling, response_format)
    return generate_batch(model.transformer, model.tokenizer, *args)


def stream_prompts(
    model: Model,
    prompts: Sequence[Any],
    max_new_tokens: Any,
    stop: Any,
    params: Any,
    sampling: dict[str, Any],
    response_format: Any = None,
) -> Iterator[Chunk]:
    """``model.stream([...])``: every row's chunks as produced; ``Chunk.index`` says whose.

    Raises as :func:`prepare`, before the first chunk."""
    args = prepare(model, prompts, max_new_tokens, stop, params, sampling, response_format)
    return stream_batch(model.transformer, model.tokenizer, *args)
