"""Speculative decoding: a drafter guesses k tokens, the target checks them in one forward pass.

One step, with the KV cache holding every token but the last one chosen (Leviathan et al.
2023, "Fast Inference from Transformers via Speculative Decoding", Algorithm 1; Chen et al.
2023, "Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2):

1. the drafter (:mod:`clearlm.generation.drafters`) proposes d_1 … d_k;
2. the target runs once over [last, d_1 … d_k] (T = k + 1) and its sampling chain filters row
   i with the history + d_1 … d_i, giving p_0 … p_k, the very distributions plain decoding
   would sample from after those tokens;
3. greedy: keep the longest prefix where d_i is p's argmax (:func:`accept_greedy`); sampled:
   keep d_i with probability min(1, p(d_i) / q(d_i)) and, at the first refusal, draw from
   norm(max(0, p − q)) (:func:`accept_sampled`); either way one more token comes from the
   target (the correction, or a bonus draw from p_k when all k were kept);
4. the cache is rolled back to the kept tokens (:meth:`KVCache.truncate`).

Greedy output is token for token plain greedy decoding's (each kept token is the argmax plain
decoding takes, up to the rounding of a k + 1-row pass against a 1-row one); sampled output
has plain sampling's distribution (Leviathan et al., Theorem 3.5), though not the same draws
for a seed. Speed comes from step 2 costing about one decode step while it may keep k + 1
tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

from clearlm.generation.drafters import Draw, Filter, SpeculativeStats
from clearlm.generation.loop import (
    Chunk,
    GenerationResult,
    check_fits,
    check_max_new_tokens,
    generate,
    generation_cache,
    prefill,
    stream_generate,
)
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import (
    SamplingParams,
    filter_logits,
    greedy,
    log_softmax,
    make_generator,
    pick,
    softmax,
)
from clearlm.tokenizer import Tokenizer


class Drafter(Protocol):
    """What speculative decoding asks of a drafter (see :mod:`clearlm.generation.drafters`)."""

    num_draft: int

    def start(self, prompt: Sequence[int], capacity: int) -> None: ...

    def draft(
        self, history: Sequence[int], k: int, filt: Filter, draw: Draw
    ) -> tuple[list[int], torch.Tensor | None]: ...


def accept_greedy(drafted: Sequence[int], p: torch.Tensor) -> tuple[int, int]:
    """Greedy verification: how many drafts the target keeps, and the token that follows.

    Args:
        drafted: d_1 … d_k.
        p: (k + 1, V) the target's filtered logits; row i follows the history + d_1 … d_i.

    Returns:
        (n, token): d_1 … d_n equal the target's argmax at rows 0 … n − 1, and token is the
        argmax at row n (ties to the lowest id, as :func:`clearlm.sampling.chain.greedy`).
    """
    choice = greedy(p).tolist()  # (k + 1,)
    n = 0
    while n < len(drafted) and drafted[n] == choice[n]:
        n += 1
    return n, choice[n]


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)), (V,) probabilities: what to draw from after refusing a draft
    (Leviathan et al. 2023, section 2.3; Chen et al. 2023, eq. 1). When p = q it is 0/0; a
    draft is then never refused, and p itself is returned."""
    r = (p - q).clamp(min=0)  # (V,)
    total = r.sum()
    return r / total if total > 0 else p


def accept_sampled(
    drafted: Sequence[int], p: torch.Tensor, q: torch.Tensor, generator: torch.Generator
) -> tuple[int, int]:
    """Rejection-sampling verification (Leviathan et al. 2023 Algorithm 1; Chen et al. 2023
    Algorithm 2): the kept prefix and the next token, together distributed exactly as tokens
    drawn one by one from p.

    Args:
        drafted: d_1 … d_k, d_i drawn from q[i − 1].
        p: (k + 1, V) the target's probabilities, row i after the history + d_1 … d_i.
        q: (k, V) the drafter's probabilities for the same positions.
        generator: the sequence's seeded generator (on p's device).

    Returns:
        (n, token): d_1 … d_n kept; token drawn from norm(max(0, p_n − q_n)) after a refusal,
        or from p_k when all k were kept.
    """
    for i, x in enumerate(drafted):
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[i, x] >= p[i, x]:  # u ≥ p(x) / q(x): refused (no division by q = 0)
            token = torch.multinomial(residual(p[i], q[i]), 1, generator=generator)
            return i, int(token)
    token = torch.multinomial(p[len(drafted)], 1, generator=generator)
    return len(drafted), int(token)


def point_masses(drafted: Sequence[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """q for a drafter that proposes without a distribution (prompt lookup): (k, V) one-hot."""
    ids = torch.tensor(list(drafted), dtype=torch.long, device=device)  # (k,)
    return torch.nn.functional.one_hot(ids, vocab_size).to(torch.float32)  # (k, V)


def history_filter(params: SamplingParams, n_prompt: int) -> Filter:
    """``filt(logits (V,), history) -> (V,)`` float32: the sampling chain without the pick, for
    one position after ``history`` (its penalties count that history; the frequency and
    presence penalties its part after the first ``n_prompt`` ids), exactly as plain decoding's
    sampler filters the same position."""
    needs_history = (
        params.repetition_penalty != 1.0
        or params.frequency_penalty != 0
        or params.presence_penalty != 0
    )

    def filt(logits: torch.Tensor, history: Sequence[int]) -> torch.Tensor:
        if not needs_history:
            return filter_logits(logits[None], None, params)[0]
        seq = torch.tensor([list(history)], dtype=torch.long, device=logits.device)  # (1, S)
        return filter_logits(logits[None], seq, params, seq[:, n_prompt:])[0]  # (V,)

    return filt


@torch.inference_mode()
def speculative_steps(
    model: Transformer,
    prompt: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    drafter: Drafter,
    stats: SpeculativeStats | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (token id, its filtered logits (V,) float32) one token at a time, as
    :func:`clearlm.generation.loop.generate_step` yields its tokens: up to max_new_tokens or the
    context length; the caller stops earlier by not asking for more (no token past an end id is
    ever shown). ``stats`` (if given) counts steps, drafted and kept tokens.

    Raises:
        ContextLengthError: the prompt leaves no room for a new token.
        SamplingParamsError: max_new_tokens is not an integer ≥ 0.
    """
    stats = stats if stats is not None else SpeculativeStats()
    check_max_new_tokens(max_new_tokens)
    check_fits(len(prompt), model.config.context_length)
    n_new = min(max_new_tokens, model.config.context_length - len(prompt))
    if n_new == 0:
        return
    cache = generation_cache(model, len(prompt), max_new_tokens)
    drafter.start(prompt, len(prompt) + n_new)
    generator = None if params.is_greedy else make_generator(params.seed, model.device)
    filt = history_filter(params, len(prompt))

    def draw(filtered: torch.Tensor) -> int:
        return int(pick(filtered, params, generator)[0])

    history = list(prompt)
    seq = torch.tensor([history], dtype=torch.long, device=model.device)  # (1, P)
    row = filt(prefill(model, seq, cache)[0], history)  # (V,)
    token = draw(row)
    yield token, row
    history.append(token)
    while len(history) - len(prompt) < n_new:
        # the cache holds history[:-1]; one pass may add k + 1 tokens, so k < what is left
        k = min(drafter.num_draft, n_new - (len(history) - len(prompt)) - 1)
        drafted, q = drafter.draft(history, k, filt, draw) if k > 0 else ([], None)
        drafted, q = drafted[:k], None if q is None else q[:k]
        fed = torch.tensor([history[-1:] + drafted], dtype=torch.long, device=model.device)
        logits = model(fed, cache=cache)[0]  # (1 + k, V)
        rows = torch.stack(
            [filt(logits[i], history + drafted[:i]) for i in range(len(drafted) + 1)]
        )  # (1 + k, V)
        n, token = verify(drafted, rows, q, params, generator)
        cache.truncate(len(history) + n)  # keep history + d_1 … d_n; `token` is fed next step
        stats.steps, stats.drafted, stats.accepted = (
            stats.steps + 1, stats.drafted + len(drafted), stats.accepted + n
        )  # fmt: skip
        for t, r in zip([*drafted[:n], token], rows[: n + 1], strict=True):
            yield t, r
            history.append(t)


def verify(
    drafted: list[int],
    rows: torch.Tensor,
    q: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[int, int]:
    """Step 3: (kept drafts n, next token) from the target's filtered rows (1 + k, V) and the
    drafter's filtered logits q (k, V), or None for point masses (prompt lookup)."""
    if params.is_greedy:
        return accept_greedy(drafted, rows)
    assert generator is not None
    p = softmax(rows)  # (1 + k, V)
    if q is None:
        q_probs = point_masses(drafted, rows.shape[-1], rows.device)
    else:
        q_probs = softmax(q)
    return accept_sampled(drafted, p, q_probs, generator)


def speculative_generate_step(
    model: Transformer,
    prompt: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    drafter: Drafter,
    stats: SpeculativeStats | None = None,
) -> Iterator[tuple[int, float]]:
    """:func:`speculative_steps` as (token id, logprob) pairs, the form of
    :func:`clearlm.generation.loop.generate_step` (the logprob under the target's filtered
    distribution, as plain decoding reports it). Raises as speculative_steps."""
    for token, row in speculative_steps(model, prompt, params, max_new_tokens, drafter, stats):
        yield token, float(log_softmax(row)[token])


def speculative_generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    drafter: Drafter,
    stop: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
) -> GenerationResult:
    """:func:`clearlm.generation.loop.generate` with speculative steps; the result's
    ``speculative`` holds the counts (acceptance rate). Raises as generate."""
    stats = SpeculativeStats()
    steps = speculative_generate_step(model, prompt, params, max_new_tokens, drafter, stats)
    result = generate(model, tokenizer, prompt, params, max_new_tokens, stop, on_text, steps=steps)
    result.speculative = stats
    return result


def speculative_stream(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt: Sequence[int],
    params: SamplingParams,
    max_new_tokens: int,
    drafter: Drafter,
    stop: Sequence[str] = (),
) -> Iterator[Chunk]:
    """:func:`clearlm.generation.loop.stream_generate` with speculative steps."""
    steps = speculative_generate_step(model, prompt, params, max_new_tokens, drafter)
    return stream_generate(model, tokenizer, prompt, params, max_new_tokens, stop, steps=steps)
