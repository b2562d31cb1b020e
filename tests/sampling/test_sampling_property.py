"""Property test (hypothesis): every public function of clearlm.sampling.chain, on logits drawn in
float16 / bfloat16 / float32 with -inf entries and all -inf rows, at temperatures from 1e-6 to
1e6, gives float32 logits that are finite or -inf with a softmax summing to 1, keeps the most
likely token, or raises SamplingError for a row that has no possible token."""

from __future__ import annotations

import math

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")  # in the `test` extras of pyproject.toml
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from clearlm.errors import SamplingError  # noqa: E402
from clearlm.sampling.chain import (  # noqa: E402
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

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@st.composite
def logits_batches(draw) -> torch.Tensor:
    """(B, V) logits of a drawn dtype: finite values across the dtype's range, -inf entries,
    and sometimes a row that is all -inf."""
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    big = float(torch.finfo(dtype).max)
    B, V = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    value = st.one_of(
        st.floats(-big, big, width=32),
        st.floats(-20.0, 20.0, width=32),
        st.sampled_from([-math.inf, 0.0, 1.0, big, -big]),
    )
    rows = [draw(st.lists(value, min_size=V, max_size=V)) for _ in range(B)]
    if draw(st.booleans()):
        rows[draw(st.integers(0, B - 1))] = [-math.inf] * V
    return torch.tensor(rows, dtype=torch.float32).to(dtype)  # rounds to the dtype (no NaN)


temperatures = st.floats(1e-6, 1e6).map(lambda t: float(f"{t:.3g}")) | st.sampled_from([1e-6, 1e6])
penalties = st.floats(0.01, 100.0) | st.just(1.0)


def check(out: torch.Tensor, x: torch.Tensor, keeps_top: bool = True) -> None:
    """Float32, finite or -inf; empty rows of x stay empty; the others have a softmax summing to
    1 and, unless a penalty reordered them, keep the input's (lowest-id) most likely token."""
    assert out.dtype == torch.float32 and out.shape == x.shape
    assert not torch.isnan(out).any() and not torch.isposinf(out).any()
    empty = torch.isneginf(x).all(-1)  # (B,)
    assert torch.isneginf(out[empty]).all()
    if (~empty).any():
        alive, xs = out[~empty], x[~empty].float()
        assert torch.isfinite(alive).any(-1).all()
        torch.testing.assert_close(softmax(alive).sum(-1), torch.ones(len(alive)))
        if keeps_top:
            top = xs.argmax(-1, keepdim=True)  # lowest id among the maxima
            assert torch.isfinite(alive.gather(-1, top)).all()


@settings(max_examples=300, deadline=None, database=None)  # no .hypothesis/ folder
@given(
    x=logits_batches(),
    t=temperatures,
    k=st.integers(0, 10),
    p=st.floats(0.01, 1.0),
    m=st.floats(0.0, 1.0),
    r=penalties,
)
def test_every_function_gives_a_distribution_or_a_typed_error(x, t, k, p, m, r) -> None:
    prev = torch.tensor([0, 2, 2])
    check(apply_temperature(x, t), x)
    check(apply_top_k(x, k), x)
    check(apply_top_p(x, p), x)
    check(apply_min_p(x, m), x)
    check(apply_repetition_penalty(x, prev, r), x, keeps_top=False)
    params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, repetition_penalty=r, seed=0)
    check(filter_logits(x, prev, params), x, keeps_top=False)
    check(filter_logits(x, None, params), x)
    empty = bool(torch.isneginf(x).all(-1).any())
    finishers = [
        lambda: softmax(x),
        lambda: log_softmax(x),
        lambda: greedy(x),
        lambda: sample_from(apply_temperature(x, t), torch.Generator().manual_seed(0)),
        lambda: make_sampler(params)(x, prev),
        lambda: make_sampler(SamplingParams(temperature=0))(x, prev),
    ]
    for finish in finishers:
        if empty:
            with pytest.raises(SamplingError):
                finish()
            continue
        finish()
    if empty:
        return
    probs = softmax(x)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(x)))
    assert not torch.isnan(log_softmax(x)).any()
    tokens, logprobs = make_sampler(params)(x, prev)
    filtered = filter_logits(x, prev, params)
    assert torch.isfinite(filtered.gather(-1, tokens[:, None])).all()  # drawn from the kept
    assert (logprobs <= 0).all() and torch.isfinite(logprobs).all()
