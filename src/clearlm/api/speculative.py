"""The speculative-decoding options of ``Model.generate`` / ``stream`` / ``chat``: ``draft=``
(a smaller loaded Model with the same tokenizer), ``prompt_lookup=True`` (n-gram lookup in the
text so far) and ``num_draft=`` (tokens drafted per step), turned into a drafter of
:mod:`clearlm.generation.drafters` and run by :mod:`clearlm.generation.speculative`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from clearlm.errors import SamplingParamsError
from clearlm.generation.drafters import DraftModel, PromptLookup, check_same_vocabulary
from clearlm.generation.loop import Chunk, GenerationResult, generate, stream_generate
from clearlm.generation.speculative import (
    Drafter,
    speculative_generate,
    speculative_stream,
)
from clearlm.generation.stops import type_name
from clearlm.sampling.chain import SamplingParams
from clearlm.sampling.grammar import GrammarState

# Tokens drafted per step when num_draft is not given: a draft model's guesses cost a forward
# pass each, prompt lookup's nothing (transformers' prompt_lookup_num_tokens is 10 as well).
DRAFT_MODEL_K = 5
PROMPT_LOOKUP_K = 10


def make_drafter(
    target: Any,
    draft: Any = None,
    prompt_lookup: bool | PromptLookup = False,
    num_draft: int | None = None,
) -> Drafter | None:
    """The drafter the options ask for, or None (plain decoding).

    Args:
        target: the Model that generates (its tokenizer and vocabulary size).
        draft: a loaded Model (``clearlm.load(...)``) with the same tokenizer, or None.
        prompt_lookup: draft by n-gram lookup in the prompt and the text so far; True, or a
            :class:`~clearlm.generation.drafters.PromptLookup` with its own n-gram lengths.
        num_draft: most tokens drafted per step (default 5 with a draft model, 10 with lookup).

    Raises:
        SamplingParamsError: both draft and prompt_lookup, num_draft without either, a draft
            that is not a Model, on another device, or with another tokenizer.
    """
    if isinstance(prompt_lookup, PromptLookup):
        if draft is not None or num_draft is not None:
            raise SamplingParamsError("a PromptLookup drafter sets its own num_draft; give it "
                                      "alone, without draft= or num_draft=")
        return prompt_lookup
    if not isinstance(prompt_lookup, bool):
        raise SamplingParamsError(
            f"prompt_lookup must be True, False or a PromptLookup, got {type_name(prompt_lookup)} "
            f"{prompt_lookup!r}"
        )
    if draft is not None and prompt_lookup:
        raise SamplingParamsError("give draft= or prompt_lookup=True, not both")
    if prompt_lookup:
        return PromptLookup(PROMPT_LOOKUP_K if num_draft is None else num_draft)
    if draft is None:
        if num_draft is not None:
            raise SamplingParamsError("num_draft needs draft=MODEL or prompt_lookup=True")
        return None
    if not (hasattr(draft, "transformer") and hasattr(draft, "tokenizer")):
        raise SamplingParamsError(
            f"draft must be a loaded Model (clearlm.load(...)), got {type_name(draft)}"
        )
    if draft.transformer.device != target.transformer.device:
        raise SamplingParamsError(
            f"the draft model is on {draft.transformer.device}, the target on "
            f"{target.transformer.device}; load both on the same device"
        )
    check_same_vocabulary(target.tokenizer, draft.tokenizer, draft.path)
    k = DRAFT_MODEL_K if num_draft is None else num_draft
    return DraftModel(draft.transformer, k, target.config.vocab_size)


def run_generate(
    model: Any,
    ids: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str],
    on_text: Callable[[str], None] | None,
    drafter: Drafter | None,
    grammar: GrammarState | None = None,
) -> GenerationResult:
    """One prompt to the end: plain :func:`~clearlm.generation.loop.generate` (with
    ``grammar``: structured output), or speculative with ``drafter`` (the result's
    ``speculative`` then holds the acceptance counts).

    Raises SamplingParamsError for a drafter with a grammar (they do not combine yet)."""
    t, tok = model.transformer, model.tokenizer
    if drafter is None:
        return generate(t, tok, ids, params, max_new_tokens, stop, on_text, grammar)
    refuse_grammar(grammar)
    return speculative_generate(t, tok, ids, params, max_new_tokens, drafter, stop, on_text)


def run_stream(
    model: Any,
    ids: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str],
    drafter: Drafter | None,
    grammar: GrammarState | None = None,
) -> Iterator[Chunk]:
    """One prompt's chunks, plain or speculative (as :func:`run_generate`)."""
    t, tok = model.transformer, model.tokenizer
    if drafter is None:
        return stream_generate(t, tok, ids, params, max_new_tokens, stop, grammar)
    refuse_grammar(grammar)
    return speculative_stream(t, tok, ids, params, max_new_tokens, drafter, stop)


def refuse_grammar(grammar: GrammarState | None) -> None:
    """Raise SamplingParamsError for structured output with speculative decoding: the drafts
    would have to follow the grammar too, which is not built."""
    if grammar is not None:
        raise SamplingParamsError(
            "response_format (structured output) and speculative decoding (draft, "
            "prompt_lookup) do not combine yet; drop one of them"
        )


def refuse_batch(drafter: Drafter | None) -> None:
    """Raise SamplingParamsError when a list of prompts asks for speculative decoding (it runs
    one sequence at a time)."""
    if drafter is not None:
        raise SamplingParamsError(
            "speculative decoding (draft=, prompt_lookup=) runs one prompt at a time; "
            "give one prompt, or leave it out for a list"
        )
