"""Batched generation: several prompts run together through the engine, each row on its own.

``model.generate([p1, p2, ...])`` and ``model.stream([...])`` come here. Every row has its own
sampling settings and seed, its own stop strings and token limit, and finishes at its own step;
its tokens and text equal those of the same prompt run alone (clearlm.generation.loop) with the
same settings, because the row is prefilled whole in its own cache slot, sampled by its own
sampler, and turned into text by its own :class:`~clearlm.generation.text_stream.TextStream`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from clearlm.engine import Request
from clearlm.engine.scheduler import build_engine
from clearlm.errors import ContextLengthError
from clearlm.generation.grammar import grammar_state
from clearlm.generation.loop import Chunk, GenerationResult, check_fits, check_max_new_tokens
from clearlm.generation.text_stream import TextStream
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import SamplingParams
from clearlm.tokenizer import Tokenizer

MAX_BATCH = 32  # rows running at once; further prompts wait for a free slot


def stream_batch(
    model: Transformer,
    tokenizer: Tokenizer,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    max_new_tokens: Sequence[int],
    stops: Sequence[Sequence[str]],
    grammars: Sequence[str | None] | None = None,
) -> Iterator[Chunk]:
    """Yield every row's chunks as they are produced; ``Chunk.index`` says whose.

    Each row's chunks are those :func:`clearlm.generation.loop.stream_generate` yields for it alone
    (the last one carries its finish_reason); rows interleave, one token per row per step.
    ``grammars``: structured output, a compiled grammar or None per row
    (:func:`clearlm.sampling.grammar.compile_response_format`); each row gets its own state.

    Raises (at the call, before generating):
        ContextLengthError: a prompt is empty or leaves no room for a new token (the message
            starts with ``prompt <index>:``).
        SamplingParamsError: a max_new_tokens is not an integer ≥ 0.

    Raises (while generating): GrammarError or SamplingError of a row (``prompt <index>:``):
    a grammar the engine gives up on at some step, logits with no possible token.
    """
    ctx = model.config.context_length
    for n in max_new_tokens:
        check_max_new_tokens(n)
    for i, p in enumerate(prompts):
        try:
            check_fits(len(p), ctx, min(max_new_tokens[i], 1))  # 0 tokens: a full context fits
        except ContextLengthError as e:  # say which prompt of the batch
            raise ContextLengthError(f"prompt {i}: {e}") from None
    return run_rows(model, tokenizer, prompts, params, max_new_tokens, stops, grammars)


def run_rows(
    model: Transformer,
    tokenizer: Tokenizer,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    max_new_tokens: Sequence[int],
    stops: Sequence[Sequence[str]],
    grammars: Sequence[str | None] | None = None,
) -> Iterator[Chunk]:
    """The generator behind :func:`stream_batch` (arguments already checked)."""
    ctx = model.config.context_length
    texts = [TextStream(tokenizer, s, p.ignore_eos) for s, p in zip(stops, params, strict=True)]
    for i, n in enumerate(max_new_tokens):
        if n == 0:  # nothing to generate: alone, the stream ends at once
            yield Chunk(texts[i].finish(), None, None, "length", index=i)
    live = [i for i, n in enumerate(max_new_tokens) if n > 0]
    if not live:
        return
    # a slot holds the longest row; each row stops by itself at its own limit
    size = max(len(prompts[i]) + min(max_new_tokens[i], ctx - len(prompts[i])) for i in live)
    engine = build_engine(
        model,
        tokenizer.eos_ids,
        max_batch=min(len(live), MAX_BATCH),
        max_seq_len=size,
        prefill_chunk=sum(len(prompts[i]) for i in live),  # every prompt whole, at once
    )
    V = model.config.vocab_size
    for i in live:
        grammar = grammar_state(tokenizer, V, grammars[i]) if grammars else None
        request = Request(str(i), list(prompts[i]), params[i], max_new_tokens[i], grammar=grammar)
        engine.add(request)
    while engine.has_work():
        for event in engine.step():
            i = int(event.request_id)
            if event.error is not None:  # one call, one answer: its error is the call's
                raise type(event.error)(f"prompt {i}: {event.error}")
            out, reason = texts[i].add(event.token)
            if reason is not None:  # an end id or a stop string: the row ends here
                if event.finish_reason is None:
                    engine.abort(event.request_id)
                yield Chunk(out, event.token, event.logprob, reason, index=i)
                continue
            yield Chunk(out, event.token, event.logprob, index=i)
            if event.finish_reason is not None:  # length / context_length / grammar: flush
                yield Chunk(texts[i].finish(), None, None, event.finish_reason, index=i)


def generate_batch(
    model: Transformer,
    tokenizer: Tokenizer,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    max_new_tokens: Sequence[int],
    stops: Sequence[Sequence[str]],
    grammars: Sequence[str | None] | None = None,
) -> list[GenerationResult]:
    """Run :func:`stream_batch` to the end: one GenerationResult per prompt, in order.

    Times per row: prefill_s from the start to the row's first token, decode_s from there to
    its end (rows share the steps, so these are wall-clock shares, not per-row costs).
    """
    B = len(prompts)
    text: list[list[str]] = [[] for _ in range(B)]
    tokens: list[list[int]] = [[] for _ in range(B)]
    logprobs: list[list[float]] = [[] for _ in range(B)]
    reasons, firsts, ends = ["length"] * B, [0.0] * B, [0.0] * B
    t0 = time.perf_counter()
    chunks = stream_batch(model, tokenizer, prompts, params, max_new_tokens, stops, grammars)
    for chunk in chunks:
        i, now = chunk.index, time.perf_counter()
        if chunk.token is not None:
            if not tokens[i]:
                firsts[i] = now
            tokens[i].append(chunk.token)
            logprobs[i].append(chunk.logprob)  # type: ignore[arg-type]
        text[i].append(chunk.text)
        if chunk.finish_reason is not None:
            reasons[i], ends[i] = chunk.finish_reason, now
    return [
        GenerationResult(
            text="".join(text[i]),
            tokens=tokens[i],
            finish_reason=reasons[i],
            prompt_tokens=len(prompts[i]),
            prefill_s=(firsts[i] or ends[i]) - t0,
            decode_s=ends[i] - (firsts[i] or ends[i]),
            logprobs=logprobs[i],
        )
        for i in range(B)
    ]
