"""OpenAI's frequency and presence penalties, against a computation written out independently
(OpenAI's formula ``mu[j] - c[j] * a_freq - float(c[j] > 0) * a_pres``, one token at a time in
Python floats), their place in the chain, and the sampler counting only generated tokens."""

from __future__ import annotations

import math

import pytest
import torch

import clearlm.sampling.filters as filters
from clearlm.errors import SamplingParamsError
from clearlm.sampling.chain import SamplingParams, filter_logits, make_sampler, sampling_chain


def openai_formula(logits: list[float], generated: list[int], freq: float, pres: float):
    """The API reference's pseudo-code, literally: a count per token, then the subtraction."""
    counts = {j: generated.count(j) for j in set(generated)}
    return [
        mu - counts.get(j, 0) * freq - float(counts.get(j, 0) > 0) * pres
        for j, mu in enumerate(logits)
    ]


@pytest.mark.parametrize(("freq", "pres"), [(0.5, 0.0), (0.0, 1.5), (-2.0, 2.0), (1.25, -0.75)])
def test_penalties_equal_openais_formula(freq, pres):
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(2, 30, generator=g)  # (B, V)
    logits[0, 3] = -math.inf  # a removed token stays removed
    generated = torch.randint(0, 30, (2, 12), generator=g)  # (B, G) with repeats
    got = filters.presence_penalty(
        filters.frequency_penalty(logits, generated, freq), generated, pres
    )
    for row in range(2):
        want = openai_formula(logits[row].tolist(), generated[row].tolist(), freq, pres)
        assert got[row].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert got[0, 3] == -math.inf
    # tokens never generated keep their logit exactly
    never = [j for j in range(30) if j not in generated[1].tolist()]
    assert torch.equal(got[1, never], logits[1, never])


def test_out_of_range_ids_are_not_counted_and_zero_is_off():
    logits = torch.tensor([1.0, 2.0, 3.0])
    gen = torch.tensor([-1, 5, 1, 1])
    assert filters.frequency_penalty(logits, gen, 1.0).tolist() == [1.0, 0.0, 3.0]
    assert filters.presence_penalty(logits, gen, 1.0).tolist() == [1.0, 1.0, 3.0]
    assert filters.frequency_penalty(logits, gen, 0.0) is logits
    assert filters.presence_penalty(logits, torch.zeros(0, dtype=torch.long), 1.0) is logits


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.01, -2.5, math.nan, "1", True])
def test_range_is_minus_two_to_two(name, value):
    with pytest.raises(SamplingParamsError, match=f"{name} must be in \\[-2, 2\\]"):
        SamplingParams(**{name: value})


def test_chain_lists_them_only_when_set_right_after_the_repetition_penalty():
    names = [s.name for s in sampling_chain(SamplingParams(), None)]
    assert "presence_penalty" not in names and "frequency_penalty" not in names
    p = SamplingParams(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3)
    steps = sampling_chain(p, None, torch.tensor([1, 2]))
    assert [s.name for s in steps][:4] == [
        "repetition_penalty", "frequency_penalty", "presence_penalty", "temperature",
    ]  # fmt: skip
    assert [s.active for s in steps][1:3] == [True, True]
    greedy = SamplingParams(temperature=0, presence_penalty=0.5)
    assert [s.name for s in sampling_chain(greedy, None)] == [
        "repetition_penalty",
        "presence_penalty",
    ]


def test_sampler_counts_only_tokens_after_the_first_history():
    """The first call's history is the prompt: penalties see only what came after it."""
    p = SamplingParams(temperature=0, frequency_penalty=2.0, presence_penalty=1.0)
    logits = torch.tensor([[0.0, 3.0, 2.0, 2.9]])  # (1, V)
    sample = make_sampler(p)
    prompt = torch.tensor([[1, 1, 1]])  # token 1 in the prompt: not penalised
    tok, _ = sample(logits, prompt)
    assert int(tok[0]) == 1
    # now token 1 was generated once: 3 - 2 - 1 = 0 < 2.9
    tok, lp = sample(logits, torch.cat([prompt, tok.view(1, 1)], dim=1))
    assert int(tok[0]) == 3
    want = filter_logits(logits, None, p, torch.tensor([[1]])).log_softmax(-1)[0, 3]
    assert float(lp[0]) == pytest.approx(float(want))
