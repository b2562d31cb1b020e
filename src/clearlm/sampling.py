"""Softmax and sampling: small pure functions on a logits tensor, chained by :func:`make_sampler`.

Shapes: logits are ``(..., V)`` (usually ``(B, V)`` or ``(V,)``), previous tokens ``(..., S)``
int64. Logits may be float16, bfloat16, float32 or float64 and may hold ``-inf`` (an impossible
token). Every ``apply_*`` function computes in float32 and returns float32 logits (finite or
``-inf``) with removed tokens set to ``-inf``, and never writes into its input; when its setting
means "off" it returns the input cast to float32 (the input object itself when already float32).
Overflow is handled in :mod:`clearlm.sampling_numerics`. A row that is all ``-inf`` passes
through the filters unchanged; ``softmax``, ``log_softmax``, ``greedy`` and the draw refuse it
(and NaN / ``+inf`` logits) with a :class:`~clearlm.errors.SamplingError`.
The filters follow Hugging Face's ``transformers.generation.logits_process`` warpers exactly
(parity is tested), so a setting means the same thing here as in ``model.generate``, with one
difference: where tied tokens straddle the top-p boundary, clearlm keeps the lowest ids (HF's
kept ids then depend on the order of an unstable sort). Ties go to the lowest id everywhere.
:func:`clearlm.sampling_explain.explain_sampling` runs the same chain one step at a time and
records what each step kept.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from clearlm.errors import SamplingParamsError
from clearlm.sampling_numerics import check_logits, left_range, shifted_penalty, shifted_temperature

Sampler = Callable[[Tensor, Tensor | None], tuple[Tensor, Tensor]]


def _real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)  # bool is an int: reject it


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# setting -> (is the value valid?, the valid range as the error message states it)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda t: _real(t) and 0 <= t < math.inf, "in [0, inf) (0 means greedy)"),
    "temperature>0": (lambda t: _real(t) and 0 < t < math.inf, "in (0, inf)"),
    "top_k": (lambda k: _int(k) and k >= 0, "an integer >= 0 (0 means off)"),
    "top_p": (lambda p: _real(p) and 0 < p <= 1, "in (0, 1] (1 means off)"),
    "min_p": (lambda m: _real(m) and 0 <= m <= 1, "in [0, 1] (0 means off)"),
    "repetition_penalty": (lambda r: _real(r) and 0 < r < math.inf, "in (0, inf) (1 means off)"),
    "seed": (lambda s: s is None or (_int(s) and 0 <= s < 2**64), "None or an int in [0, 2**64)"),
}


def _validate(name: str, value: object, rule: str | None = None) -> None:
    """Raise a one-line SamplingParamsError naming the setting, its value and the valid range."""
    ok, valid = _RULES[rule or name]
    if not ok(value):
        raise SamplingParamsError(f"{name} must be {valid}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token from the logits; defaults mean plain sampling from softmax.

    Attributes:
        temperature: divide logits by T before softmax; 0 means greedy (argmax). Range [0, inf).
        top_k: keep the k most likely tokens; 0 means off. Integer >= 0.
        top_p: nucleus sampling (Holtzman et al. 2019); 1.0 means off. Range (0, 1].
        min_p: drop tokens whose probability is below min_p * max probability; 0 means off.
        repetition_penalty: CTRL penalty (Keskar et al. 2019) on tokens already seen; 1.0 is off.
        seed: seed of the sampler's torch.Generator, in [0, 2**64); None means a random seed.

    Raises:
        SamplingParamsError: a value is out of range (the message names it and the range).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            _validate(f.name, getattr(self, f.name))

    @property
    def is_greedy(self) -> bool:
        """True when temperature == 0: the sampler takes the argmax instead of drawing."""
        return self.temperature == 0


def softmax(logits: Tensor) -> Tensor:
    """Probabilities P_i = e^{z_i} / Σ_j e^{z_j} over the last axis (the seeds' stage 5).

    ``(..., V)`` float of any precision -> ``(..., V)`` float32; ``-inf`` logits get probability 0.
    Written out rather than ``torch.softmax`` (equal to rounding, tested): subtracting the row
    maximum leaves the ratio unchanged but keeps e^z from overflowing.
    Raises SamplingError for a row that is all ``-inf``, or NaN / ``+inf`` logits.
    """
    check_logits(logits)
    z = logits.to(torch.float32)
    z = z - z.amax(dim=-1, keepdim=True)  # (..., V), max is now 0
    e = z.exp()
    return e / e.sum(dim=-1, keepdim=True)


def log_softmax(logits: Tensor) -> Tensor:
    """log P_i = z_i - m - log Σ_j e^{z_j - m}, m = max(z); ``(..., V)`` -> ``(..., V)`` float32.

    Raises SamplingError as :func:`softmax`."""
    check_logits(logits)
    z = logits.to(torch.float32)
    z = z - z.amax(dim=-1, keepdim=True)  # (..., V)
    return z - z.exp().sum(dim=-1, keepdim=True).log()


def apply_repetition_penalty(logits: Tensor, previous_tokens: Tensor, penalty: float) -> Tensor:
    """Penalise every token id that appears in ``previous_tokens`` (CTRL, Keskar et al. 2019).

    A seen token's logit is divided by ``penalty`` when positive and multiplied when negative, so
    penalty > 1 always makes it less likely; a token seen twice is penalised once. As HF
    ``RepetitionPenaltyLogitsProcessor``, ids outside ``[0, V)`` are ignored (-1 can pad rows).
    ``logits`` ``(..., V)`` float -> ``(..., V)``; ``previous_tokens`` ``(..., S)`` int64 whose
    batch shape broadcasts to the logits'. Penalty 1.0 returns ``logits`` unchanged (in float32).
    Computed in float32 as HF; should that overflow (a tiny penalty), in float64 and shifted
    (see :mod:`clearlm.sampling_numerics`). Raises SamplingParamsError unless 0 < penalty < inf.
    """
    _validate("repetition_penalty", penalty)
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


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """logits / T (HF ``TemperatureLogitsWarper``): T < 1 sharpens, T > 1 flattens.

    ``(..., V)`` float -> ``(..., V)`` float32; T == 1.0 returns ``logits`` unchanged (in float32).
    Greedy (T == 0) is the sampler's job, not this function's. Divided in float32, bit for bit
    as HF; when that leaves the float range (a bfloat16 logit of 1e38 at T = 1e-6), the result
    is (z - max z) / T computed in float64 instead: the same softmax, every entry <= 0.
    Raises SamplingParamsError unless 0 < T < inf.
    """
    _validate("temperature", temperature, "temperature>0")
    z = logits.to(torch.float32)  # as HF generate casts the scores
    if temperature == 1.0:
        return z
    out = z / temperature  # (..., V)
    return shifted_temperature(z, temperature) if left_range(z, out) else out


def apply_top_k(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits per row, set the rest to -inf (HF ``TopKLogitsWarper``).

    Tokens tied with the k-th largest value are all kept, so more than k may survive (e.g.
    k = 1 on ``[3, 1, 3]`` keeps both 3s), so the kept set does not depend on tie order.
    ``(..., V)`` float -> ``(..., V)`` float32; k == 0 or k >= V returns ``logits`` unchanged.
    Raises SamplingParamsError unless k is an integer >= 0.
    """
    _validate("top_k", k)
    logits = logits.to(torch.float32)
    if k == 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1), the k-th largest value
    return logits.masked_fill(logits < kth, -math.inf)


def apply_top_p(logits: Tensor, p: float) -> Tensor:
    """Nucleus filtering (Holtzman et al. 2019) as HF ``TopPLogitsWarper``, ties to the lowest id.

    Keeps the smallest set of most likely tokens whose probabilities sum to >= p, and always the
    most likely token. Computed as HF does: sort ascending, drop tokens whose cumulative
    probability is <= 1 - p. At an exact tie (cumulative == p) float rounding decides, as in HF.
    Equal logits are ordered so that the lower id counts as the more likely, so when tied tokens
    straddle the boundary the lowest ids stay (``torch.zeros(4)`` at p = 0.5 keeps ids 0 and 1).
    The cumulative sums are HF's bit for bit (tied tokens have equal probabilities); only which
    tied ids are kept can differ from HF, whose unstable sort in practice keeps the highest.
    ``(..., V)`` float -> ``(..., V)`` float32; p == 1.0 returns ``logits`` unchanged.
    Raises SamplingParamsError unless 0 < p <= 1.
    """
    _validate("top_p", p)
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


def apply_min_p(logits: Tensor, min_p: float) -> Tensor:
    """Drop tokens whose probability is < min_p * (max probability) (HF ``MinPLogitsWarper``).

    The most likely token always survives (min_p = 1.0 keeps only tokens tied for the maximum).
    A threshold, so the kept set does not depend on tie order.
    ``(..., V)`` float -> ``(..., V)`` float32; min_p == 0 returns ``logits`` unchanged.
    Raises SamplingParamsError unless 0 <= min_p <= 1. Source: Nguyen et al. 2024, "min-p".
    """
    _validate("min_p", min_p)
    logits = logits.to(torch.float32)
    if min_p == 0:
        return logits
    probs = torch.softmax(logits, dim=-1)  # (..., V) as HF; an all -inf row: NaN, none dropped
    drop = probs < min_p * probs.amax(dim=-1, keepdim=True)
    drop = drop.scatter(-1, probs.argmax(dim=-1, keepdim=True), False)  # keep the top token
    return logits.masked_fill(drop, -math.inf)


def greedy(logits: Tensor) -> Tensor:
    """Argmax over the last axis: ``(..., V)`` float -> ``(...,)`` int64.

    Ties go to the lowest token id: ``torch.argmax`` documents that it returns the first maximal
    index (tested at the start and in the middle of the vocabulary).
    Raises SamplingError for a row that is all ``-inf``, or NaN / ``+inf`` logits.
    """
    check_logits(logits)
    return torch.argmax(logits, dim=-1)


def sample_from(logits: Tensor, generator: torch.Generator) -> Tensor:
    """Draw one token id per row from softmax(logits) with ``torch.multinomial``.

    ``(..., V)`` float -> ``(...,)`` int64 (0-d for ``(V,)`` logits); ``-inf`` tokens are never
    drawn. ``generator`` is a seeded ``torch.Generator`` on the logits' device.
    Raises SamplingError as :func:`softmax`.
    """
    probs = softmax(logits)
    flat = probs.reshape(-1, probs.shape[-1])  # (N, V), multinomial wants 1-D or 2-D
    ids = torch.multinomial(flat, num_samples=1, generator=generator)  # (N, 1)
    return ids.reshape(probs.shape[:-1])  # (...,)


def filter_logits(logits: Tensor, previous_tokens: Tensor | None, params: SamplingParams) -> Tensor:
    """All of :func:`make_sampler`'s chain but the draw: ``(..., V)`` -> ``(..., V)`` float32.

    Logits are first cast to float32, as HF ``generate`` does. With ``params.is_greedy`` only the
    repetition penalty applies (HF adds no warpers when not sampling). ``previous_tokens``
    ``(..., S)`` int64 or None (no penalty).
    """
    logits = logits.to(torch.float32)
    # The order is Hugging Face's (`GenerationMixin._get_logits_processor`): processors that edit
    # the model's scores (repetition penalty) come first, then the warpers that reshape the
    # distribution: temperature, top-k, top-p, min-p. The penalty must see the raw logits, since
    # its divide-or-multiply rule depends on their sign. Temperature must come before top-p and
    # min-p, because both threshold probabilities that T changes (top-k's set does not depend on
    # T). Top-k before top-p caps the nucleus; min-p after temperature follows llama.cpp's
    # reasoning quoted in HF. Same order, same settings => same distribution as HF.
    if previous_tokens is not None:
        logits = apply_repetition_penalty(logits, previous_tokens, params.repetition_penalty)
    if params.is_greedy:
        return logits
    logits = apply_temperature(logits, params.temperature)
    logits = apply_top_k(logits, params.top_k)
    logits = apply_top_p(logits, params.top_p)
    return apply_min_p(logits, params.min_p)


def make_sampler(params: SamplingParams) -> Sampler:
    """Build ``sample(logits, previous_tokens) -> (token_ids, logprobs)`` from ``params``.

    ``logits`` ``(B, V)`` or ``(V,)`` float; ``previous_tokens`` ``(B, S)`` or ``(S,)`` int64, or
    None. Returns token ids ``(B,)`` or ``()`` int64 and their log-probabilities (same shape,
    float32) under the final distribution, softmax(:func:`filter_logits`): filtered and
    renormalised (when greedy: the penalised distribution at T = 1). The sampler owns a
    ``torch.Generator`` made on the first logits' device and seeded with ``params.seed`` (or
    randomly when None), so the same seed and inputs give the same tokens.
    """
    generator: torch.Generator | None = None

    def sample(logits: Tensor, previous_tokens: Tensor | None) -> tuple[Tensor, Tensor]:
        nonlocal generator
        filtered = filter_logits(logits, previous_tokens, params)  # (..., V) float32
        if params.is_greedy:
            tokens = greedy(filtered)
        else:
            if generator is None:
                generator = torch.Generator(device=logits.device)
                _ = generator.seed() if params.seed is None else generator.manual_seed(params.seed)
            tokens = sample_from(filtered, generator)
        logprobs = log_softmax(filtered).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (...,)
        return tokens, logprobs

    return sample
