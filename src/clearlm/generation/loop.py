"""Autoregressive generation: prefill the prompt once, then one token per step with a KV cache.

Layers, from the bottom:
- ``prefill`` and ``decode_step``: one forward pass each, returning last-position logits.
- ``generate_step``: a generator that samples and yields one token at a time (token ids only).
- ``stream_generate``: text on top: streaming detokenization, stop strings, EOS, token and
  context limits, and a ``finish_reason`` on the last chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from clearlm.errors import ContextLengthError, SamplingParamsError
from clearlm.generation.drafters import SpeculativeStats
from clearlm.generation.stops import check_callable, check_stop, finish_reason
from clearlm.generation.text_stream import TextStream
from clearlm.model.kv_cache import KVCache
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import Sampler, SamplingParams, make_sampler
from clearlm.sampling.grammar import GrammarState
from clearlm.sampling.params import check_logit_bias, is_int
from clearlm.tokenizer import Tokenizer


def new_cache(model: Transformer, batch_size: int, max_seq_len: int) -> KVCache:
    """A KV cache sized for `max_seq_len` positions (tokens) in the model's dtype, on its device
    (``Transformer.new_cache``; a parallel rank's holds only its layers or heads)."""
    return model.new_cache(batch_size, max_seq_len)


FIRST_COLUMNS = 256  # a growing generation cache starts at a multiple of this (make_room)


def generation_cache(model: Transformer, n_prompt: int, max_new_tokens: int,
                     growing: bool = False) -> KVCache:
    """The KV cache one generation runs in: room for the prompt's n_prompt tokens plus
    max_new_tokens, capped at the context length (:func:`generation_limit`).

    ``growing``: start smaller, at the prompt (and one token) rounded up to FIRST_COLUMNS
    positions, and let :func:`make_room` double it as the text grows. A decode step reads the
    whole cache (a compiled one keeps its shapes that way: clearlm.runtime.aot), so a cache sized
    for a generous max_new_tokens made every step slower (SmolLM2, 33 tokens made: 84 tok/s
    with room for 64, 19 with room for 8,000). The cache's size is part of what a step computes
    (float32 sums over its key axis), so whatever recomputes a generation's logits (the CLI's
    --logprobs) sizes and grows its cache the same way."""
    limit = generation_limit(model, n_prompt, max_new_tokens)
    if growing and isinstance(model, Transformer):  # a parallel model's ranks keep one size
        return new_cache(model, 1, min(limit, -(-(n_prompt + 1) // FIRST_COLUMNS)
                                       * FIRST_COLUMNS))
    return new_cache(model, 1, limit)


def generation_limit(model: Transformer, n_prompt: int, max_new_tokens: int) -> int:
    """Positions a generation can reach: n_prompt + max_new_tokens, capped at the context."""
    return n_prompt + min(max_new_tokens, model.config.context_length - n_prompt)


def make_room(model: Transformer, cache: KVCache, position: int, limit: int) -> None:
    """Grow ``cache`` (twice its size, at most ``limit`` positions) until it can hold a token at
    ``position``; the RoPE tables grow first, as a new cache's do (Transformer.new_cache). A
    cache that already holds ``position`` (any cache made with room for ``limit``, a parallel
    model's included) is left as it is."""
    if position < cache.max_seq_len:
        return
    size = cache.max_seq_len
    while size <= position:
        size *= 2
    size = min(size, limit)
    model.reserve_positions(size)
    cache.grow(size)


@torch.inference_mode()
def prefill(model: Transformer, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the whole prompt in one forward pass: tokens (B, T) int64 → last logits (B, V)."""
    return model(tokens, cache=cache, last_only=True)[:, -1, :]


@torch.inference_mode()
def decode_step(model: Transformer, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One new token per sequence against the cache: token (B, 1) int64 → logits (B, V)."""
    return model(token, cache=cache, last_only=True)[:, -1, :]


def check_fits(
    n_prompt: int,
    context_length: int,
    new_tokens: int = 1,
    what: str = "the model's context length",
) -> None:
    """Raise ContextLengthError unless a prompt of n_prompt tokens is not empty and leaves room
    for ``new_tokens`` more (1 to generate, 0 to only score the prompt) in the context; ``what``
    names the bound in the message (the CLI's ``-c``: "the context size (-c)")."""
    if n_prompt == 0:
        raise ContextLengthError("the prompt is empty (0 tokens); give at least one token")
    if n_prompt > context_length:
        raise ContextLengthError(
            f"the prompt has {n_prompt} tokens but {what} is {context_length}; shorten the prompt"
        )
    if n_prompt + new_tokens > context_length:
        raise ContextLengthError(
            f"the prompt has {n_prompt} tokens and fills {what} of {context_length}: no room "
            "for a new token; shorten the prompt"
        )


def check_max_new_tokens(max_new_tokens: Any) -> None:
    """Raise SamplingParamsError unless max_new_tokens is an integer ≥ 0 (a bool is not one).
    The one check of generate_step and of the batch (clearlm.engine.batch)."""
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise SamplingParamsError(f"max_new_tokens must be an integer ≥ 0, got {max_new_tokens!r}")


def generate_step(
    model: Transformer,
    prompt: Sequence[int],
    sampler: Sampler,
    max_new_tokens: int,
    grammar: GrammarState | None = None,
) -> Iterator[tuple[int, float]]:
    """Yield (token id, logprob) one step at a time, up to max_new_tokens or the context length.

    The caller decides when to stop earlier (EOS, stop strings, a complete grammar) by not
    asking for more. ``grammar`` (structured output) masks each step's logits to the tokens it
    accepts; the caller advances it with each token it takes (:func:`stream_generate` does).
    Raises ContextLengthError if the prompt is empty or leaves no room for a new token (with
    max_new_tokens 0: if it is longer than the context),
    SamplingParamsError if max_new_tokens is not an integer ≥ 0.
    """
    ctx = model.config.context_length
    check_max_new_tokens(max_new_tokens)
    check_fits(len(prompt), ctx, min(max_new_tokens, 1))  # 0 tokens: a full context is fine
    n_new = min(max_new_tokens, ctx - len(prompt))
    if n_new == 0:
        return  # nothing to generate: no forward pass either
    cache = generation_cache(model, len(prompt), max_new_tokens, growing=True)
    limit = generation_limit(model, len(prompt), max_new_tokens)
    seq = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)  # (1, P): history
    # a compiled step when one was set (clearlm.runtime.compiled.compile_decode)
    step = getattr(model, "decode_fn", None) or decode_step
    logits = prefill(model, seq, cache)  # (1, V)
    for i in range(n_new):
        if grammar is None:  # (a sampler of two arguments, any caller's, stays usable)
            token, logprob = sampler(logits, seq)  # (1,), (1,)
        else:  # the grammar's (V,) bool mask: the chain's "grammar" step
            token, logprob = sampler(logits, seq, grammar.allowed())
        yield int(token[0]), float(logprob[0])
        if i + 1 == n_new:
            break
        seq = torch.cat([seq, token.view(1, 1)], dim=1)  # (1, P + i + 1)
        make_room(model, cache, len(prompt) + i, limit)  # this token goes at P + i
        logits = step(model, token.view(1, 1), cache)


@dataclass
class Chunk:
    """One streamed piece of output.

    Attributes:
        text: new text to show (may be "" while a multi-byte character or a possible stop
            string is held back).
        token: the token id this step produced (None on the final flush chunk).
        finish_reason: None while generating; on the last chunk one of "eos" (the model's
            end token), "stop" (a stop string, or the grammar of structured output is
            complete), "length" (max_new_tokens), "context_length"
            (prompt + generated tokens filled the context window).
        index: which prompt of a batch it belongs to (0 for a single prompt).
    """

    text: str
    token: int | None = None
    logprob: float | None = None
    finish_reason: str | None = None
    index: int = 0


@dataclass
class GenerationResult:
    """A finished generation: text, token ids, why it stopped and how fast it ran.

    Times are seconds: prefill_s covers the prompt's forward pass (and the first sample),
    decode_s the remaining steps. ``speculative``: the drafted and kept counts of a
    speculative run (clearlm.generation.speculative), else None.
    """

    text: str
    tokens: list[int]
    finish_reason: str
    prompt_tokens: int
    prefill_s: float = 0.0
    decode_s: float = 0.0
    logprobs: list[float] = field(default_factory=list)
    speculative: SpeculativeStats | None = None

    def __str__(self) -> str:
        """The generated text, so ``print(model.chat(...))`` prints the answer."""
        return self.text

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0


def stream_generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    grammar: GrammarState | None = None,
    steps: Iterator[tuple[int, float]] | None = None,
) -> Iterator[Chunk]:
    """Generate text and yield it as it is produced; the last chunk carries finish_reason.

    ``steps`` is where the (token, logprob) pairs come from: by default
    :func:`generate_step` with ``make_sampler(params)``; speculative decoding passes its own
    (clearlm.generation.speculative), which yields the same tokens one at a time.

    Stop strings are matched on the decoded text, so one that spans several tokens is found;
    it is not included in the output. Text that might be the beginning of a stop string is held
    back until it is clear that it is not. ``grammar`` (structured output,
    :func:`clearlm.generation.grammar.grammar_state`) allows only the tokens it accepts and
    ends the text with "stop" once it is complete.

    Raises:
        ContextLengthError: the prompt leaves no room for a new token. SamplingParamsError: a
            logit_bias id outside the vocabulary.
    """
    check_logit_bias(params.logit_bias, model.config.vocab_size)
    text = TextStream(tokenizer, stop, ignore_eos=params.ignore_eos)
    n = 0
    if steps is None:
        steps = generate_step(model, prompt, make_sampler(params), max_new_tokens, grammar)
    for token, logprob in steps:
        n += 1
        out, reason = text.add(token)
        if grammar is not None and reason is None:
            grammar.advance(token)
            if grammar.is_done():
                out, reason = out + text.finish(), "stop"
        if reason is not None:
            yield Chunk(out, token, logprob, reason)
            return
        yield Chunk(out, token, logprob)
    # generate_step ran out: either max_new_tokens, or the context window filled up first.
    limit = model.config.context_length
    reason = finish_reason(None, (), n, max_new_tokens, len(prompt) + n, limit)
    yield Chunk(text.finish(), None, None, reason)


def generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
    grammar: GrammarState | None = None,
    steps: Iterator[tuple[int, float]] | None = None,
) -> GenerationResult:
    """Run stream_generate to the end and collect the result (optionally echoing text);
    ``steps`` as in stream_generate.

    Raises ClearLMError when on_text is neither None nor callable, SamplingParamsError for a
    stop that is not a non-empty string (both before generating). ``grammar``: structured
    output, as in :func:`stream_generate`."""
    if on_text is not None:
        check_callable(on_text, "on_text")
    stop = check_stop(stop)  # SamplingParamsError for a non-str or empty stop
    text, tokens, logprobs = [], [], []
    reason = "length"
    t0 = time.perf_counter()
    t_first = None
    for chunk in stream_generate(model, tokenizer, prompt, params, max_new_tokens, stop, grammar,
                                 steps):
        if chunk.token is not None:
            if t_first is None:
                t_first = time.perf_counter()
            tokens.append(chunk.token)
            logprobs.append(chunk.logprob)
        if chunk.text:
            text.append(chunk.text)
            if on_text is not None:
                on_text(chunk.text)
        if chunk.finish_reason is not None:
            reason = chunk.finish_reason
    t_end = time.perf_counter()
    t_first = t_first or t_end
    return GenerationResult(
        text="".join(text),
        tokens=tokens,
        finish_reason=reason,
        prompt_tokens=len(prompt),
        prefill_s=t_first - t0,
        decode_s=t_end - t_first,
        logprobs=logprobs,
    )
