"""Softmax and sampling: one chain of pure filters on a logits tensor, then the pick.

Shapes: logits are ``(..., V)`` (usually ``(B, V)`` or ``(V,)``), previous tokens ``(..., S)``
int64. Logits may be float16, bfloat16, float32 or float64 and may hold ``-inf`` (an impossible
token). The chain (:func:`sampling_chain`) is the one ordered list of steps: :func:`filter_logits`
runs it, :func:`make_sampler` runs it and picks, and
:func:`clearlm.inspect.sampling_explain.explain_sampling` runs it step by step and records what
each step kept. The filters themselves are in :mod:`clearlm.sampling.filters` (float32
arithmetic, overflow handled in :mod:`clearlm.sampling.numerics`); settings are validated once,
by :class:`SamplingParams`. The ``apply_*`` functions here are the same filters for direct
callers: they check their setting first. A row that is all ``-inf`` passes through the filters
unchanged; ``softmax``, ``log_softmax``, ``greedy`` and the draw refuse it (and NaN / ``+inf``
logits) with a :class:`~clearlm.errors.SamplingError`.
The filters follow Hugging Face's ``transformers.generation.logits_process`` warpers exactly
(parity is tested), so a setting means the same thing here as in ``model.generate``, with one
difference: where tied tokens straddle the top-p boundary, clearlm keeps the lowest ids (HF's
kept ids then depend on the order of an unstable sort). Ties go to the lowest id everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

import clearlm.sampling.filters as filters
from clearlm.sampling.numerics import check_logits
from clearlm.sampling.params import SamplingParams, validate

__all__ = [
    "SamplingParams",
    "Sampler",
    "Step",
    "apply_min_p",
    "apply_repetition_penalty",
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "filter_logits",
    "greedy",
    "log_softmax",
    "make_generator",
    "make_sampler",
    "pick",
    "sample_from",
    "sampling_chain",
    "softmax",
]

# sample(logits (..., V), previous_tokens (..., S) int64 or None, allowed (V,) bool or None)
#   -> (token ids, logprobs); ``allowed``: a grammar's next tokens (structured output)
Sampler = Callable[..., tuple[Tensor, Tensor]]


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


# --- the filters for direct callers: check the setting, then filter (sampling_filters) --------


def apply_repetition_penalty(logits: Tensor, previous_tokens: Tensor, penalty: float) -> Tensor:
    """:func:`clearlm.sampling.filters.repetition_penalty` (CTRL) after checking the penalty.

    Raises SamplingParamsError unless 0 < penalty < inf."""
    validate("repetition_penalty", penalty)
    return filters.repetition_penalty(logits, previous_tokens, penalty)


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """:func:`clearlm.sampling.filters.temperature` (logits / T) after checking T.

    Raises SamplingParamsError unless 0 < T < inf (greedy, T = 0, is the sampler's job)."""
    validate("temperature", temperature, "temperature>0")
    return filters.temperature(logits, temperature)


def apply_top_k(logits: Tensor, k: int) -> Tensor:
    """:func:`clearlm.sampling.filters.top_k` after checking k.

    Raises SamplingParamsError unless k is an integer >= 0."""
    validate("top_k", k)
    return filters.top_k(logits, k)


def apply_top_p(logits: Tensor, p: float) -> Tensor:
    """:func:`clearlm.sampling.filters.top_p` (nucleus, ties to the lowest id) after checking p.

    Raises SamplingParamsError unless 0 < p <= 1."""
    validate("top_p", p)
    return filters.top_p(logits, p)


def apply_min_p(logits: Tensor, min_p: float) -> Tensor:
    """:func:`clearlm.sampling.filters.min_p` after checking min_p.

    Raises SamplingParamsError unless 0 <= min_p <= 1."""
    validate("min_p", min_p)
    return filters.min_p(logits, min_p)


# --- the chain -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of the sampling chain.

    Attributes:
        name: the SamplingParams field it reads: "logit_bias", "repetition_penalty",
            "frequency_penalty", "presence_penalty", "temperature", "top_k", "top_p" or
            "min_p"; or "grammar" (structured output: the tokens a grammar allows).
        setting: that field's value (for "grammar": how many tokens it allows).
        active: False when the setting means "off" (or, for the penalty, there is no history):
            the step would return its input unchanged, so the chain skips it.
        fn: ``(..., V)`` float32 logits -> ``(..., V)`` float32 logits.
    """

    name: str
    setting: float | int | dict[int, float]
    active: bool
    fn: Callable[[Tensor], Tensor]


def sampling_chain(
    params: SamplingParams,
    previous_tokens: Tensor | None,
    generated: Tensor | None = None,
    allowed: Tensor | None = None,
) -> tuple[Step, ...]:
    """The steps between the logits and the pick, in the order they run.

    The order is Hugging Face's (`GenerationMixin._get_logits_processor`): processors that edit
    the model's scores (repetition penalty) come first, then the warpers that reshape the
    distribution: temperature, top-k, top-p, min-p. The penalty must see the raw logits, since
    its divide-or-multiply rule depends on their sign. Temperature must come before top-p and
    min-p, because both threshold probabilities that T changes (top-k's set does not depend on
    T). Top-k before top-p caps the nucleus; min-p after temperature follows llama.cpp's
    reasoning quoted in HF. Same order, same settings => same distribution as HF. Greedy
    (temperature 0) has only the penalty: HF adds no warpers when not sampling.
    ``previous_tokens`` ``(..., S)`` int64 or None (no penalty).
    OpenAI's frequency and presence penalties (not in HF) come right after the repetition
    penalty, as vLLM applies all three before temperature; they count only ``generated``
    ``(..., G)`` int64 (the tokens after the prompt) and are listed only when set (non-zero),
    so a chain without them is HF's. OpenAI's ``logit_bias`` (not in HF) comes first of all,
    as OpenAI adds it "to the logits generated by the model prior to sampling", and is listed
    only when given, so +100 forces a token through every later step, greedy included.
    Structured output's ``grammar`` step comes right after it (first when there is no bias):
    ``allowed`` ``(V,)`` bool, the tokens a grammar accepts next
    (:class:`clearlm.sampling.grammar.GrammarState`), or None (no step). It sets the others to
    ``-inf``, so no bias, penalty or draw can pick them, and the later steps (top-k, top-p,
    min-p) choose among the tokens that keep the output valid, as in llama.cpp, where the
    grammar sampler runs before the others.
    """
    p, history = params, previous_tokens
    seen = history if history is not None else torch.zeros(0, dtype=torch.long)  # (S,)
    penalty = Step(
        "repetition_penalty",
        p.repetition_penalty,
        seen.shape[-1] > 0 and p.repetition_penalty != 1.0,
        lambda z: filters.repetition_penalty(z, seen, p.repetition_penalty),
    )
    gen = generated if generated is not None else torch.zeros(0, dtype=torch.long)  # (G,)
    fp, pp, has_gen = p.frequency_penalty, p.presence_penalty, gen.shape[-1] > 0
    openai = (
        Step("frequency_penalty", fp, has_gen, lambda z: filters.frequency_penalty(z, gen, fp)),
        Step("presence_penalty", pp, has_gen, lambda z: filters.presence_penalty(z, gen, pp)),
    )
    bias = p.logit_bias or {}
    first = (Step("logit_bias", bias, True, lambda z: filters.logit_bias(z, bias)),) if bias else ()
    if allowed is not None:
        mask = allowed
        first += (Step("grammar", int(mask.sum()), True, lambda z: filters.grammar_mask(z, mask)),)
    penalties = (*first, penalty, *(s for s in openai if s.setting != 0))
    if p.is_greedy:
        return penalties
    return (
        *penalties,
        Step(
            "temperature",
            p.temperature,
            p.temperature != 1,
            lambda z: filters.temperature(z, p.temperature),
        ),
        Step("top_k", p.top_k, p.top_k != 0, lambda z: filters.top_k(z, p.top_k)),
        Step("top_p", p.top_p, p.top_p != 1.0, lambda z: filters.top_p(z, p.top_p)),
        Step("min_p", p.min_p, p.min_p != 0, lambda z: filters.min_p(z, p.min_p)),
    )


def filter_logits(
    logits: Tensor,
    previous_tokens: Tensor | None,
    params: SamplingParams,
    generated: Tensor | None = None,
    allowed: Tensor | None = None,
) -> Tensor:
    """The chain without the pick: ``(..., V)`` -> ``(..., V)`` float32, ``-inf`` where removed.

    Logits are first cast to float32, as HF ``generate`` does; then every active step of
    :func:`sampling_chain` runs. ``previous_tokens`` ``(..., S)`` int64 or None (no penalty);
    ``generated`` ``(..., G)`` int64, the generated ones among them (for the OpenAI penalties);
    ``allowed`` ``(V,)`` bool, a grammar's next tokens, or None.
    """
    x = logits.to(torch.float32)
    for step in sampling_chain(params, previous_tokens, generated, allowed):
        if step.active:
            x = step.fn(x)
    return x


# --- the pick --------------------------------------------------------------------------------


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


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """The sampler's ``torch.Generator`` on ``device``: seeded with ``seed``, or randomly
    (``Generator.seed()``) when None. The one place a draw's randomness is made."""
    generator = torch.Generator(device=device)
    _ = generator.seed() if seed is None else generator.manual_seed(seed)
    return generator


def pick(
    filtered: Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """The chain's last link: token ids ``(...,)`` int64 and their log-probabilities (float32)
    under softmax(``filtered``). Greedy takes the argmax (``generator`` unused, may be None);
    otherwise one draw with ``generator``. ``filtered`` is :func:`filter_logits`'s output."""
    if params.is_greedy:
        tokens = greedy(filtered)
        return tokens, greedy_logprobs(filtered, tokens)
    assert generator is not None, "sampling needs a generator (make_generator)"
    tokens = sample_from(filtered, generator)
    logprobs = log_softmax(filtered).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (...,)
    return tokens, logprobs


def greedy_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """log_softmax(logits) at the argmax ``tokens`` (checked logits ``(..., V)`` float32,
    tokens ``(...,)`` int64) → ``(...,)`` float32, the same numbers with less work.

    The argmax's logit is the row maximum m, so its z − m is exactly 0 and log_softmax there is
    −log Σ_j e^{z_j − m}: no second check of the logits and no (..., V) subtraction after the
    sum (:func:`log_softmax` computes both). SmolLM2's V = 49,152: 170 → about 110 µs per pick
    with the argmax (1 thread)."""
    top = logits.gather(-1, tokens.unsqueeze(-1))  # (..., 1): m
    return -(logits - top).exp().sum(dim=-1).log()


def make_sampler(params: SamplingParams) -> Sampler:
    """Build ``sample(logits, previous_tokens) -> (token_ids, logprobs)`` from ``params``.

    ``logits`` ``(B, V)`` or ``(V,)`` float; ``previous_tokens`` ``(B, S)`` or ``(S,)`` int64, or
    None. Returns token ids ``(B,)`` or ``()`` int64 and their log-probabilities (same shape,
    float32) under the final distribution, softmax(:func:`filter_logits`): filtered and
    renormalised (when greedy: the penalised distribution at T = 1). The sampler owns a
    generator (:func:`make_generator`) made on the first logits' device, so the same seed and
    inputs give the same tokens. The history of the first call is taken as the prompt: the
    frequency and presence penalties count only the tokens added to it after that. A third
    argument ``allowed`` ``(V,)`` bool (or None) adds the chain's grammar step.
    """
    generator: torch.Generator | None = None
    n_prompt: int | None = None

    def sample(
        logits: Tensor, previous_tokens: Tensor | None, allowed: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        nonlocal generator, n_prompt
        if generator is None and not params.is_greedy:
            generator = make_generator(params.seed, logits.device)
        if n_prompt is None:
            n_prompt = 0 if previous_tokens is None else previous_tokens.shape[-1]
        generated = None if previous_tokens is None else previous_tokens[..., n_prompt:]
        filtered = filter_logits(logits, previous_tokens, params, generated, allowed)
        return pick(filtered, params, generator)

    return sample
