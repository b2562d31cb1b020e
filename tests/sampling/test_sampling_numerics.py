"""Every public function of clearlm.sampling.chain on hostile numbers: float16 / bfloat16 logits,
temperatures from 1e-6 to 1e6 (and beyond), -inf entries and rows that are all -inf.

The right values come from float64 arithmetic written out here; the property test (hypothesis)
draws such inputs and checks that each function gives float32 logits that are finite or -inf
with a softmax summing to 1, or raises SamplingError for a row with no possible token.
"""

from __future__ import annotations

import math

import pytest
import torch

from clearlm.errors import ClearLMError, SamplingError
from clearlm.inspect.sampling_explain import explain_sampling
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


def softmax64(logits: list[float], temperature: float = 1.0) -> list[float]:
    """The reference: softmax(z / T) in float64, shifted by the maximum first."""
    m = max(logits)
    w = [0.0 if z == -INF else math.exp((z - m) / temperature) for z in logits]
    return [x / sum(w) for x in w]


# --- the issue's input --------------------------------------------------------------------------

ISSUE = [2.875, 2.955078125, 11.0625, -2.447265625]


def test_float16_logits_at_temperature_1e_4() -> None:
    x = torch.tensor(ISSUE, dtype=torch.float16)
    out = apply_temperature(x, 1e-4)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    expected = softmax64(x.double().tolist(), 1e-4)
    assert expected == [0.0, 0.0, 1.0, 0.0]
    assert softmax(out).tolist() == expected
    # the whole sampler: the draw picks id 2 with log-probability 0 (T = 1e-4); greedy too,
    # with the log-probability of the unscaled distribution (greedy applies no temperature)
    token, logprob = make_sampler(SamplingParams(temperature=1e-4, seed=0))(x, None)
    assert int(token) == 2 and float(logprob) == 0.0
    token, logprob = make_sampler(SamplingParams(temperature=0))(x, None)
    p2 = softmax64(x.double().tolist())[2]
    assert int(token) == 2 and float(logprob) == pytest.approx(math.log(p2), abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [1e-6, 1e-4, 0.3, 7.0, 1e6, 1e30, 1e300, 1e-300])
def test_temperature_matches_float64_for_every_dtype(dtype: torch.dtype, t: float) -> None:
    x = torch.tensor([[*ISSUE, -INF], [0.0, -1.0, -1.0, -3.0, -70.0]], dtype=dtype)
    got = softmax(apply_temperature(x, t))
    for row, ref_row in zip(got, x.double().tolist(), strict=True):
        torch.testing.assert_close(
            row.double(),
            torch.tensor(softmax64(ref_row, t), dtype=torch.float64),
            atol=1e-6,
            rtol=0,
        )


def test_huge_bfloat16_logits_fall_back_to_the_shifted_form() -> None:
    x = torch.tensor([3.0e38, 2.9e38, -1.0e38, -INF], dtype=torch.bfloat16)
    for t in (1e-6, 0.5, 1e10):
        out = apply_temperature(x, t)
        assert not torch.isnan(out).any() and not torch.isposinf(out).any()
        expected = torch.tensor(softmax64(x.double().tolist(), t), dtype=torch.float64)
        torch.testing.assert_close(softmax(out).double(), expected, atol=1e-6, rtol=0)


def test_all_negative_row_at_a_tiny_temperature_keeps_its_top_token() -> None:
    # -1 / 1e-300 and -2 / 1e-300 both underflow to -inf in float32: the row would be empty
    out = apply_temperature(torch.tensor([-2.0, -1.0, -5.0]), 1e-300)
    assert out.tolist() == [-INF, 0.0, -INF]


def test_repetition_penalty_on_half_logits_and_tiny_penalties() -> None:
    x = torch.tensor([60000.0, -60000.0, 1.0], dtype=torch.float16)
    out = apply_repetition_penalty(x, torch.tensor([0, 1]), 0.5)  # 120000 passes float16
    assert out.dtype == torch.float32 and out.tolist() == [120000.0, -30000.0, 1.0]
    out = apply_repetition_penalty(torch.tensor([2.0, 1.0, 3.0]), torch.tensor([0, 1]), 1e-40)
    assert softmax(out).tolist() == softmax64([2e40, 1e40, 3.0])  # [1, 0, 0]
    with pytest.raises(SamplingError, match="repetition_penalty"):
        apply_repetition_penalty(torch.tensor([2.0, 1.0]), torch.tensor([0]), 1e-310)


# --- rows with no possible token ----------------------------------------------------------------

EMPTY = torch.tensor([[0.5, -INF, 1.0], [-INF, -INF, -INF]])


@pytest.mark.parametrize(
    "call",
    [
        softmax,
        log_softmax,
        greedy,
        lambda x: sample_from(x, torch.Generator().manual_seed(0)),
        lambda x: make_sampler(SamplingParams(seed=0))(x, None),
        lambda x: make_sampler(SamplingParams(temperature=0))(x, None),
        lambda x: explain_sampling(x[1], None, SamplingParams(seed=0)),
    ],
    ids=["softmax", "log_softmax", "greedy", "sample_from", "sampler", "greedy-sampler", "explain"],
)
def test_an_all_minus_inf_row_raises_a_typed_error(call) -> None:
    with pytest.raises(SamplingError, match="every logit of a row is -inf") as info:
        call(EMPTY)
    assert isinstance(info.value, ClearLMError) and "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [math.nan, INF])
def test_nan_or_plus_inf_logits_raise_a_typed_error(bad: float) -> None:
    with pytest.raises(SamplingError, match="NaN or \\+inf"):
        greedy(torch.tensor([0.0, bad, 1.0]))


def test_filters_pass_an_all_minus_inf_row_through() -> None:
    prev = torch.tensor([[0, 1], [0, 2]])
    for out in (
        apply_temperature(EMPTY, 1e-6),
        apply_temperature(EMPTY, 1e6),
        apply_top_k(EMPTY, 1),
        apply_top_p(EMPTY, 0.5),
        apply_min_p(EMPTY, 0.5),
        apply_repetition_penalty(EMPTY, prev, 1.5),
        filter_logits(EMPTY, prev, SamplingParams(0.1, 2, 0.9, 0.05, 1.3)),
    ):
        assert out.dtype == torch.float32
        assert torch.isneginf(out[1]).all()
        assert softmax(out[:1]).sum().item() == pytest.approx(1.0)


def test_the_explanation_follows_the_sampler_on_half_logits() -> None:
    x = torch.tensor(ISSUE, dtype=torch.float16)
    params = SamplingParams(temperature=1e-4, top_p=0.9, seed=0)
    e = explain_sampling(x, None, params)
    token, logprob = make_sampler(params)(x, None)
    assert (e.token, e.probability, e.logprob) == (int(token), 1.0, float(logprob))
    assert e.steps[2].name == "temperature" and e.steps[2].kept == (0, 1, 2, 3)
    assert e.steps[2].top[0] == (2, 1.0)
