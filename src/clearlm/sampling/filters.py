"""The filters of the sampling chain, as pure functions on logits, unchecked.

Each takes ``(..., V)`` logits of any float dtype, computes in float32 and returns float32
logits (finite or ``-inf``) with removed tokens set to ``-inf``, never writing into its input;
when its setting means "off" it returns the input cast to float32 (the input object itself when
already float32). Overflow is handled in :mod:`clearlm.sampling.numerics`. A row that is all
``-inf`` passes through unchanged.

The settings are trusted: :class:`~clearlm.sampling.params.SamplingParams` validated them once,
so nothing here is checked per token. Direct callers use the checked ``apply_*`` functions of
:mod:`clearlm.sampling.chain`, which validate the setting and then call these.
The filters follow Hugging Face's ``transformers.generation.logits_process`` exactly (parity is
tested), except that where tied tokens straddle the top-p boundary the lowest ids stay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from clearlm.sampling.numerics import left_range, shifted_penalty, shifted_temperature


def repetition_penalty(logits: Tensor, previous_tokens: Tensor, penalty: float) -> Tensor:
    """Penalise every token id that appears in ``previous_tokens`` (CTRL, Keskar et al. 2019).

    A seen token's logit is divided by ``penalty`` when positive and multiplied when negative, so
    penalty > 1 always makes it less likely; a token seen twice is penalised once. As HF
    ``RepetitionPenaltyLogitsProcessor``, ids outside ``[0, V)`` are ignored (-1 can pad rows).
    ``logits`` ``(..., V)`` float -> ``(..., V)``; ``previous_tokens`` ``(..., S)`` int64 whose
    batch shape broadcasts to the logits'. Penalty 1.0 returns ``logits`` unchanged (in float32).
    Computed in float32 as HF; should that overflow (a tiny penalty), in float64 and shifted
    (see :mod:`clearlm.sampling.numerics`).
    """
    logits = logits.to(torch.float32)
    if penalty == 1.0 or previous_tokens.shape[-1] == 0:
        return logits
    V = logits.shape[-1]
    ids = previous_tokens.to(logits.device).expand(*logits.shape[:-1], -1)  # (..., S)
    ids = torch.where((ids >= 0) & (ids < V), ids, V)  # out-of-range ids -> spare slot V
    seen = torch.zeros((*logits.shape[:-1], V + 1), dtype=torch.bool, device=logits.device)
    seen = seen.scatter(-1, ids, True)[..., :V]  # (..., V), drop spare slot
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    out = torch.where(seen, penalised, logits)
    return shifted_penalty(logits, seen, penalty) if left_range(logits, out) else out


def temperature(logits: Tensor, t: float) -> Tensor:
    """logits / T (HF ``TemperatureLogitsWarper``): T < 1 sharpens, T > 1 flattens.

    ``(..., V)`` float -> ``(..., V)`` float32; T == 1.0 returns ``logits`` unchanged (in float32).
    Greedy (T == 0) is the sampler's job, not this function's. Divided in float32, bit for bit
    as HF; when that leaves the float range (a bfloat16 logit of 1e38 at T = 1e-6), the result
    is (z - max z) / T computed in float64 instead: the same softmax, every entry <= 0.
    """
    z = logits.to(torch.float32)  # as HF generate casts the scores
    if t == 1.0:
        return z
    out = z / t  # (..., V)
    return shifted_temperature(z, t) if left_range(z, out) else out


def top_k(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits per row, set the rest to -inf (HF ``TopKLogitsWarper``).

    Tokens tied with the k-th largest value are all kept, so more than k may survive (e.g.
    k = 1 on ``[3, 1, 3]`` keeps both 3s), so the kept set does not depend on tie order.
    ``(..., V)`` float -> ``(..., V)`` float32; k == 0 or k >= V returns ``logits`` unchanged.
    """
    logits = logits.to(torch.float32)
    if k == 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1), the k-th largest value
    return logits.masked_fill(logits < kth, -math.inf)


def top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2019) as HF ``TopPLogitsWarper``, ties to the lowest id.

    Keeps the smallest set of most likely tokens whose probabilities sum to >= p, and always the
    most likely token. Computed as HF does: sort ascending, drop tokens whose cumulative
    probability is <= 1 - p. At an exact tie (cumulative == p) float rounding decides, as in HF.
    Equal logits are ordered so that the lower id counts as the more likely, so when tied tokens
    straddle the boundary the lowest ids stay (``torch.zeros(4)`` at p = 0.5 keeps ids 0 and 1).
    The cumulative sums are HF's bit for bit (tied tokens have equal probabilities); only which
    tied ids are kept can differ from HF, whose unstable sort in practice keeps the highest.
    ``(..., V)`` float -> ``(..., V)`` float32; p == 1.0 returns ``logits`` unchanged.
    """
    logits = logits.to(torch.float32)
    if p == 1.0:
        return logits
    # descending + stable puts a tie's lowest id first; flipped, ascending with it last (kept)
    descending, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    sorted_logits, order = descending.flip(-1), order.flip(-1)  # (..., V) ascending
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)  # (..., V), as HF
    drop_sorted = cumulative <= 1 - p
    drop_sorted[..., -1] = False  # the most likely token always survives
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # (..., V) back in vocabulary order
    return logits.masked_fill(drop, -math.inf)


def min_p(logits: Tensor, m: float) -> Tensor:
    """Drop tokens whose probability is < m * (max probability) (HF ``MinPLogitsWarper``).

    The most likely token always survives (m = 1.0 keeps only tokens tied for the maximum).
    A threshold, so the kept set does not depend on tie order.
    ``(..., V)`` float -> ``(..., V)`` float32; m == 0 returns ``logits`` unchanged.
    Source: Nguyen et al. 2024, "min-p".
    """
    logits = logits.to(torch.float32)
    if m == 0:
        return logits
    probs = torch.softmax(logits, dim=-1)  # (..., V) as HF; an all -inf row: NaN, none dropped
    drop = probs < m * probs.amax(dim=-1, keepdim=True)
    drop = drop.scatter(-1, probs.argmax(dim=-1, keepdim=True), False)  # keep the top token
    return logits.masked_fill(drop, -math.inf)


def token_counts(tokens: Tensor, vocab_size: int) -> Tensor:
    """How many times each id occurs: ``(..., G)`` int64 -> ``(..., V)`` float32 counts.

    Ids outside ``[0, V)`` are not counted (as :func:`repetition_penalty` ignores them)."""
    ids = torch.where((tokens >= 0) & (tokens < vocab_size), tokens, vocab_size)  # (..., G)
    ones = torch.ones_like(ids, dtype=torch.float32)
    counts = torch.zeros((*tokens.shape[:-1], vocab_size + 1), device=tokens.device)
    counts = counts.scatter_add(-1, ids, ones)  # (..., V + 1)
    return counts[..., :vocab_size]  # (..., V), spare slot dropped


def frequency_penalty(logits: Tensor, generated: Tensor, penalty: float) -> Tensor:
    """OpenAI's frequency penalty: ``logit_j - c_j * penalty``, c_j = how many times token j was
    generated so far (the prompt does not count, as in OpenAI's and vLLM's definition).

    Source: OpenAI API reference, "Frequency and presence penalties" (``mu[j] - c[j] *
    alpha_frequency - float(c[j] > 0) * alpha_presence``). ``logits`` ``(..., V)`` float ->
    ``(..., V)`` float32; ``generated`` ``(..., G)`` int64. Penalty 0 or no history returns
    ``logits`` unchanged (in float32). ``-inf`` stays ``-inf``; the range [-2, 2] times a count
    of at most the context length cannot overflow float32.
    """
    logits = logits.to(torch.float32)
    if penalty == 0 or generated.shape[-1] == 0:
        return logits
    counts = token_counts(generated.expand(*logits.shape[:-1], -1), logits.shape[-1])
    return logits - counts * penalty


def presence_penalty(logits: Tensor, generated: Tensor, penalty: float) -> Tensor:
    """OpenAI's presence penalty: ``logit_j - [c_j > 0] * penalty``: once for every token
    generated so far, however often (see :func:`frequency_penalty` for the source and shapes).
    """
    logits = logits.to(torch.float32)
    if penalty == 0 or generated.shape[-1] == 0:
        return logits
    counts = token_counts(generated.expand(*logits.shape[:-1], -1), logits.shape[-1])
    return logits - (counts > 0).to(torch.float32) * penalty


def logit_bias(logits: Tensor, bias: Mapping[int, float]) -> Tensor:
    """OpenAI's ``logit_bias``: add ``bias[j]`` to the logit of token j, before any other step.

    Source: OpenAI API reference, ``logit_bias`` ("the bias is added to the logits generated by
    the model prior to sampling"; -100 to 100). ``(..., V)`` float -> ``(..., V)`` float32; an
    empty mapping returns ``logits`` unchanged (in float32). Ids must be in ``[0, V)`` (checked
    by :func:`clearlm.sampling.params.check_logit_bias`); ``-inf`` stays ``-inf``.
    """
    logits = logits.to(torch.float32)
    if not bias:
        return logits
    ids = torch.tensor(list(bias), dtype=torch.long, device=logits.device)  # (n,)
    values = torch.tensor(list(bias.values()), dtype=torch.float32, device=logits.device)  # (n,)
    return logits.index_add(-1, ids, values.expand(*logits.shape[:-1], -1))  # (..., V)


def grammar_mask(logits: Tensor, allowed: Tensor) -> Tensor:
    """Structured output: ``-inf`` for every token a grammar forbids at this position.

    ``logits`` ``(..., V)`` float, ``allowed`` ``(V,)`` or ``(..., V)`` bool (from
    :meth:`clearlm.sampling.grammar.GrammarState.allowed`, computed on the CPU) -> ``(..., V)``
    float32. A forbidden token can then not survive any later step, whatever its bias.
    """
    logits = logits.to(torch.float32)
    return logits.masked_fill(~allowed.to(logits.device), -math.inf)  # (..., V)
