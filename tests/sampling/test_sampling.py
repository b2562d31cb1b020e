"""Tests for clearlm.sampling.chain: the seeds' worked example, hand-computed filters, parity with
transformers' logits processors, edge cases, validation and seeded reproducibility."""

from __future__ import annotations

import math
import re

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from clearlm.errors import SamplingParamsError
from clearlm.sampling.chain import (
    SamplingParams,
    apply_min_p,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    filter_logits,
    greedy,
    log_softmax,
    make_sampler,
    sample_from,
    softmax,
)

INF = math.inf
V = 1000  # vocabulary size of the random parity batches


def logits_of(probs: list[float]) -> torch.Tensor:
    """Float32 logits whose softmax is ``probs`` (log-probabilities; -inf for 0)."""
    return torch.tensor(probs, dtype=torch.float64).log().float()


def random_logits(seed: int, batch: int = 8, vocab: int = V, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=g) * scale  # (B, V) float32


def random_tokens(seed: int, batch: int = 8, length: int = 40, vocab: int = V) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g)  # (B, S) int64, with repeats


def assert_same_logits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Same -inf pattern and equal values elsewhere."""
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = ~torch.isinf(ref)
    torch.testing.assert_close(ours[finite], ref[finite], rtol=0, atol=0)


# --- the seeds' worked example 4 -----------------------------------------------------------------


def test_seeds_example_4_output_projection_softmax_greedy() -> None:
    h = torch.tensor([0.15, -0.32, 0.48, 0.21], dtype=torch.float64)
    W = torch.tensor(
        [
            [0.9, -0.2, 0.1, 0.3, -0.5],
            [0.4, 0.7, -0.3, 0.1, 0.2],
            [-0.1, 0.5, 0.8, -0.4, 0.3],
            [0.2, -0.6, 0.2, 0.9, 0.1],
        ],
        dtype=torch.float64,
    )  # (D=4, V=5), one column per word
    vocab = ["。", "，", "但是", "所以", "呢"]
    logits = h @ W  # (4,) @ (4, 5) -> (5,)
    expected_logits = torch.tensor([0.001, -0.140, 0.537, 0.010, 0.026], dtype=torch.float64)
    torch.testing.assert_close(logits, expected_logits, rtol=0, atol=5e-4)
    probs = softmax(logits)
    assert probs.dtype == torch.float32
    expected = torch.tensor([0.178190, 0.154756, 0.304554, 0.179800, 0.182700])
    torch.testing.assert_close(probs, expected, rtol=0, atol=1e-6)
    assert vocab[int(greedy(logits))] == "但是"
    token, logprob = make_sampler(SamplingParams(temperature=0))(logits, None)
    assert int(token) == 2
    assert float(logprob) == pytest.approx(math.log(0.304554), abs=1e-5)


# --- softmax -------------------------------------------------------------------------------------


def test_softmax_matches_torch_and_float64() -> None:
    x = random_logits(0)
    torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1))
    torch.testing.assert_close(log_softmax(x), torch.log_softmax(x, dim=-1))
    x64 = x.double()
    ref = x64.exp() / x64.exp().sum(-1, keepdim=True)
    torch.testing.assert_close(softmax(x64), ref.float(), rtol=0, atol=1e-7)
    assert softmax(x.bfloat16()).dtype == torch.float32
    assert log_softmax(x.bfloat16()).dtype == torch.float32


def test_softmax_is_numerically_stable_and_handles_minus_inf() -> None:
    big = torch.tensor([1000.0, 1000.0, -INF, 999.0])
    e = math.exp(-1)
    expected = torch.tensor([1 / (2 + e), 1 / (2 + e), 0.0, e / (2 + e)])
    torch.testing.assert_close(softmax(big), expected)
    lp = log_softmax(big)
    assert lp[2] == -INF
    torch.testing.assert_close(lp[[0, 1, 3]], expected[[0, 1, 3]].log())


# --- hand-computed filters -----------------------------------------------------------------------


def test_repetition_penalty_by_hand() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0])
    prev = torch.tensor([0, 1, 1, 4])  # token 1 twice: penalised once
    out = apply_repetition_penalty(logits, prev, 2.0)
    torch.testing.assert_close(out, torch.tensor([1.0, -2.0, 0.5, -3.0, 0.5]))
    # batch, with -1 padding and an id >= V ignored; a 1-D history broadcasts over the batch
    batch = torch.stack([logits, -logits])  # (2, 5)
    prev = torch.tensor([[2, -1, 7], [3, 3, -1]])  # (2, 3)
    out = apply_repetition_penalty(batch, prev, 4.0)
    expected = torch.tensor([[2.0, -1.0, 0.125, -3.0, 1.0], [-2.0, 1.0, -0.5, 0.75, -1.0]])
    torch.testing.assert_close(out, expected)
    shared = apply_repetition_penalty(batch, torch.tensor([0]), 0.5)  # penalty < 1 rewards
    torch.testing.assert_close(shared[:, 0], torch.tensor([4.0, -1.0]))


def test_temperature_by_hand() -> None:
    logits = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(apply_temperature(logits, 0.5), torch.tensor([2.0, 4.0, 6.0]))
    p = softmax(apply_temperature(logits, 2.0)).double()
    e = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64).exp()
    torch.testing.assert_close(p, e / e.sum(), rtol=0, atol=1e-7)


def test_top_k_by_hand_and_keeps_ties() -> None:
    logits = torch.tensor([1.0, 5.0, 2.0, 4.0, 3.0])
    assert apply_top_k(logits, 2).tolist() == [-INF, 5.0, -INF, 4.0, -INF]
    # tokens tied with the k-th value are kept (HF TopKLogitsWarper): 3 tokens survive k = 2
    tied = torch.tensor([1.0, 3.0, 2.0, 3.0, 2.0])
    assert apply_top_k(tied, 2).tolist() == [-INF, 3.0, -INF, 3.0, -INF]
    assert apply_top_k(tied, 3).tolist() == [-INF, 3.0, 2.0, 3.0, 2.0]
    assert apply_top_k(tied, 1).tolist() == [-INF, 3.0, -INF, 3.0, -INF]


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (0.75, [0.625, 0.375, 0.0, 0.0]),  # 0.5 < 0.75 <= 0.5 + 0.3
        (0.8, [0.625, 0.375, 0.0, 0.0]),  # exact boundary: see the HF parity test below
        (0.9, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
        (0.4, [1.0, 0.0, 0.0, 0.0]),  # the top token alone already covers p
    ],
)
def test_top_p_by_hand(p: float, expected: list[float]) -> None:
    probs = softmax(apply_top_p(logits_of([0.5, 0.3, 0.15, 0.05]), p))
    torch.testing.assert_close(probs, torch.tensor(expected), rtol=0, atol=1e-6)


def test_top_p_at_exact_boundary_matches_hf() -> None:
    # p = 0.8 with probs [0.5, 0.3, ...] is an exact tie (0.5 + 0.3 == p): HF decides by float
    # rounding of the ascending cumsum vs 1 - p. We follow HF bit for bit rather than arithmetic.
    logits = logits_of([0.5, 0.3, 0.15, 0.05])[None]  # (1, 4)
    assert_same_logits(apply_top_p(logits, 0.8), TopPLogitsWarper(0.8)(None, logits.clone()))


@pytest.mark.parametrize(
    ("min_p", "expected"),
    [
        (0.2, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),  # threshold 0.1
        (0.5, [0.625, 0.375, 0.0, 0.0]),  # threshold 0.25
        (0.9, [1.0, 0.0, 0.0, 0.0]),  # threshold 0.45
    ],
)
def test_min_p_by_hand(min_p: float, expected: list[float]) -> None:
    probs = softmax(apply_min_p(logits_of([0.5, 0.3, 0.15, 0.05]), min_p))
    torch.testing.assert_close(probs, torch.tensor(expected), rtol=0, atol=1e-6)


# --- parity with transformers --------------------------------------------------------------------


@pytest.mark.parametrize("penalty", [0.5, 1.1, 1.3, 2.0])
def test_repetition_penalty_matches_hf(penalty: float) -> None:
    logits, prev = random_logits(1), random_tokens(2)
    ref = RepetitionPenaltyLogitsProcessor(penalty)(prev, logits.clone())
    assert_same_logits(apply_repetition_penalty(logits, prev, penalty), ref)


@pytest.mark.parametrize("temperature", [0.1, 0.7, 1.5, 3.0])
def test_temperature_matches_hf(temperature: float) -> None:
    logits = random_logits(3)
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    assert_same_logits(apply_temperature(logits, temperature), ref)


@pytest.mark.parametrize("k", [1, 2, 5, 50, 999])
def test_top_k_matches_hf(k: int) -> None:
    logits = random_logits(4)
    logits[0, :20] = logits[0].max()  # a tie at the top of one row
    assert_same_logits(apply_top_k(logits, k), TopKLogitsWarper(k)(None, logits.clone()))


@pytest.mark.parametrize("p", [1e-6, 0.05, 0.5, 0.8, 0.9, 0.99])
@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_top_p_matches_hf(p: float, scale: float) -> None:
    logits = random_logits(5, scale=scale)
    assert_same_logits(apply_top_p(logits, p), TopPLogitsWarper(p)(None, logits.clone()))


@pytest.mark.parametrize("min_p", [0.01, 0.05, 0.2, 0.9, 1.0])
@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_min_p_matches_hf(min_p: float, scale: float) -> None:
    logits = random_logits(6, scale=scale)
    assert_same_logits(apply_min_p(logits, min_p), MinPLogitsWarper(min_p)(None, logits.clone()))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, repetition_penalty=1.2),
        SamplingParams(temperature=1.3, top_p=0.95, min_p=0.05, repetition_penalty=1.1),
        SamplingParams(temperature=0.5, top_k=10, min_p=0.1),
        SamplingParams(temperature=2.0, top_k=200, top_p=0.5, min_p=0.02, repetition_penalty=0.8),
    ],
)
def test_filter_logits_matches_hf_chain(params: SamplingParams) -> None:
    logits, prev = random_logits(7), random_tokens(8)
    chain = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        chain.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    chain.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k:
        chain.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        chain.append(TopPLogitsWarper(params.top_p))
    if params.min_p:
        chain.append(MinPLogitsWarper(params.min_p))
    assert_same_logits(filter_logits(logits, prev, params), chain(prev, logits.clone()))


# --- edge cases ----------------------------------------------------------------------------------


def test_off_settings_are_no_ops() -> None:
    logits, prev = random_logits(9), random_tokens(10)
    assert apply_repetition_penalty(logits, prev, 1.0) is logits
    assert apply_repetition_penalty(logits, prev[:, :0], 2.0) is logits  # empty history
    assert apply_temperature(logits, 1.0) is logits
    assert apply_top_k(logits, 0) is logits
    assert apply_top_k(logits, V) is logits
    assert apply_top_k(logits, V + 5) is logits
    assert apply_top_p(logits, 1.0) is logits
    assert apply_min_p(logits, 0.0) is logits
    assert torch.equal(filter_logits(logits, prev, SamplingParams()), logits)


def test_functions_never_mutate_their_input() -> None:
    logits, prev = random_logits(11), random_tokens(12)
    before, prev_before = logits.clone(), prev.clone()
    apply_repetition_penalty(logits, prev, 1.5)
    apply_temperature(logits, 0.5)
    apply_top_k(logits, 3)
    apply_top_p(logits, 0.5)
    apply_min_p(logits, 0.5)
    softmax(logits)
    log_softmax(logits)
    greedy(logits)
    sample_from(logits, torch.Generator().manual_seed(0))
    params = SamplingParams(top_k=5, top_p=0.5, min_p=0.1, repetition_penalty=1.3)
    make_sampler(params)(logits, prev)
    assert torch.equal(logits, before) and torch.equal(prev, prev_before)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_p=1e-9),
        SamplingParams(min_p=1.0),
        SamplingParams(top_k=1),
        SamplingParams(temperature=0.01, top_k=1, top_p=1e-9, min_p=1.0, repetition_penalty=5.0),
    ],
)
def test_at_least_one_token_always_survives(params: SamplingParams) -> None:
    logits = torch.cat([random_logits(13), torch.zeros(1, V), torch.full((1, V), -1e4)])
    logits[1, 7] = 1e4  # one row with a single dominant token
    filtered = filter_logits(logits, random_tokens(14, batch=10), params)
    survivors = torch.isfinite(filtered).sum(-1)  # (B,)
    assert (survivors >= 1).all()
    tokens, logprobs = make_sampler(params)(logits, random_tokens(14, batch=10))
    assert torch.isfinite(filtered.gather(-1, tokens[:, None])).all()
    assert torch.isfinite(logprobs).all()


def test_temperature_zero_is_greedy() -> None:
    logits, prev = random_logits(15), random_tokens(16)
    tokens, logprobs = make_sampler(SamplingParams(temperature=0, seed=1))(logits, None)
    assert torch.equal(tokens, logits.argmax(-1))
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]  # (B,)
    torch.testing.assert_close(logprobs, expected)
    # with a repetition penalty, greedy takes the argmax of the penalised logits
    params = SamplingParams(temperature=0, repetition_penalty=1e3, top_k=1, top_p=0.1)
    tokens, _ = make_sampler(params)(logits, prev)
    assert torch.equal(tokens, apply_repetition_penalty(logits, prev, 1e3).argmax(-1))


def test_greedy_ties_go_to_the_lowest_id() -> None:
    assert int(greedy(torch.tensor([5.0, 5.0, 1.0]))) == 0  # tie at the beginning
    assert int(greedy(torch.tensor([1.0, 3.0, 7.0, 7.0, 2.0, 7.0]))) == 2  # tie in the middle
    big = torch.zeros(3, 50_000)  # large rows: torch may reduce them in parallel chunks
    big[0, [0, 1, 49_999]] = 1.0
    big[1, [1_234, 30_000, 45_000]] = 1.0
    big[2, :] = -2.0  # every token tied
    assert greedy(big).tolist() == [0, 1_234, 0]
    assert greedy(big.bfloat16()).tolist() == [0, 1_234, 0]


def test_shapes_and_dtypes_of_the_sampler() -> None:
    sample = make_sampler(SamplingParams(top_k=10, seed=0))
    tokens, logprobs = sample(random_logits(17), random_tokens(18))
    assert tokens.shape == (8,) and tokens.dtype == torch.int64
    assert logprobs.shape == (8,) and logprobs.dtype == torch.float32
    tokens, logprobs = sample(random_logits(17)[0], random_tokens(18)[0])  # (V,), (S,)
    assert tokens.shape == () and logprobs.shape == ()
    tokens, _ = sample(random_logits(17).bfloat16(), None)
    assert tokens.shape == (8,)


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"temperature": -0.5}, "temperature must be in [0, inf)"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"min_p": -0.1}, "min_p must be in [0, 1]"),
        ({"min_p": 1.01}, "min_p"),
        ({"min_p": float("nan")}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be in (0, inf)"),
        ({"repetition_penalty": -1.2}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_invalid_params_raise_a_helpful_error(kwargs: dict, needle: str) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    (value,) = kwargs.values()
    assert needle in message and repr(value) in message and "\n" not in message


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda x: apply_temperature(x, 0.0), "temperature must be in (0, inf)"),
        (lambda x: apply_top_k(x, -3), "top_k"),
        (lambda x: apply_top_p(x, 0.0), "top_p"),
        (lambda x: apply_min_p(x, 2.0), "min_p"),
        (lambda x: apply_repetition_penalty(x, torch.tensor([0]), 0.0), "repetition_penalty"),
    ],
    ids=["temperature", "top_k", "top_p", "min_p", "repetition_penalty"],
)
def test_functions_validate_their_setting(call, needle: str) -> None:
    with pytest.raises(SamplingParamsError, match=re.escape(needle)):
        call(torch.zeros(4))


def test_valid_params() -> None:
    params = SamplingParams(temperature=0, top_k=40, top_p=0.9, min_p=0.05, seed=7)
    assert params.is_greedy and not SamplingParams().is_greedy
    assert SamplingParams(top_p=1, min_p=1, repetition_penalty=3).min_p == 1


# --- seeded sampling -----------------------------------------------------------------------------


def draw_sequence(seed: int | None, steps: int = 20) -> list[list[int]]:
    sample = make_sampler(SamplingParams(temperature=0.9, top_p=0.95, seed=seed))
    history = random_tokens(19, batch=4, length=3)  # (B, S)
    for step in range(steps):
        tokens, _ = sample(random_logits(100 + step, batch=4, scale=1.0), history)
        history = torch.cat([history, tokens[:, None]], dim=1)  # (B, S + 1)
    return history[:, 3:].tolist()


def test_same_seed_same_draws_different_seed_different_draws() -> None:
    assert draw_sequence(1234) == draw_sequence(1234)
    assert draw_sequence(1234) != draw_sequence(4321)
    unseeded = draw_sequence(None)
    assert all(0 <= t < V for row in unseeded for t in row)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_sample_frequencies_match_the_distribution() -> None:
    n = 20_000
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    logits = probs.log().float().expand(n, 4)  # (N, 4), n independent draws
    draws = sample_from(logits, torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=4).double()
    assert chi_square(counts, probs) < 16.27  # chi-square, 3 dof, p = 0.001
    # through the sampler with top_k = 2: only tokens 2 and 3, renormalised to 3/7 and 4/7
    tokens, _ = make_sampler(SamplingParams(top_k=2, seed=0))(logits, None)
    counts = torch.bincount(tokens, minlength=4).double()
    assert counts[:2].sum() == 0
    assert chi_square(counts[2:], torch.tensor([3 / 7, 4 / 7], dtype=torch.float64)) < 10.83


def test_logprob_is_log_of_the_renormalised_probability() -> None:
    logits = logits_of([0.1, 0.2, 0.3, 0.4]).expand(64, 4)  # (64, 4)
    tokens, logprobs = make_sampler(SamplingParams(top_k=2, seed=3))(logits, None)
    expected = torch.tensor([0.0, 0.0, 3 / 7, 4 / 7]).log()[tokens]
    torch.testing.assert_close(logprobs, expected)
    params = SamplingParams(temperature=0.8, top_p=0.7, min_p=0.02, repetition_penalty=1.2, seed=5)
    logits, prev = random_logits(20), random_tokens(21)
    tokens, logprobs = make_sampler(params)(logits, prev)
    probs = softmax(filter_logits(logits, prev, params))  # (B, V) renormalised
    torch.testing.assert_close(logprobs, probs.gather(-1, tokens[:, None])[:, 0].log())
