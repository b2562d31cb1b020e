"""One sampling chain: sampling_chain's ordered steps are what filter_logits runs and what
explain_sampling records; one generator factory; one Sampler type; settings are checked once,
in SamplingParams, not on every token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import clearlm.generation.loop
import clearlm.sampling.chain
import clearlm.sampling.params
from clearlm.inspect.sampling_explain import explain_sampling
from clearlm.sampling.chain import (
    SamplingParams,
    apply_min_p,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    filter_logits,
    make_generator,
    make_sampler,
    sampling_chain,
)

ORDER = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p")
ALL_ON = SamplingParams(temperature=0.7, top_k=8, top_p=0.9, min_p=0.05, repetition_penalty=1.3)


def test_the_order_is_hugging_faces_and_greedy_keeps_only_the_penalty():
    assert tuple(s.name for s in sampling_chain(ALL_ON, torch.tensor([1]))) == ORDER
    greedy = SamplingParams(temperature=0, repetition_penalty=1.3)
    assert [s.name for s in sampling_chain(greedy, torch.tensor([1]))] == ["repetition_penalty"]


def test_active_means_the_setting_is_on():
    steps = sampling_chain(SamplingParams(), torch.tensor([1]))
    assert [s.active for s in steps] == [False] * 5
    steps = sampling_chain(ALL_ON, torch.tensor([1]))
    assert [s.active for s in steps] == [True] * 5
    assert [s.setting for s in steps] == [1.3, 0.7, 8, 0.9, 0.05]
    # no history: the penalty has nothing to act on
    assert not sampling_chain(ALL_ON, None)[0].active
    assert not sampling_chain(ALL_ON, torch.zeros(0, dtype=torch.long))[0].active


def test_filter_logits_is_the_public_functions_in_order():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 40, generator=g).to(torch.float16)  # half precision on purpose
    history = torch.randint(0, 40, (2, 6), generator=g)
    p = ALL_ON
    by_hand = apply_repetition_penalty(logits, history, p.repetition_penalty)
    by_hand = apply_min_p(
        apply_top_p(apply_top_k(apply_temperature(by_hand, p.temperature), p.top_k), p.top_p),
        p.min_p,
    )
    got = filter_logits(logits, history, p)
    assert got.dtype == torch.float32 and torch.equal(got, by_hand)


def test_the_explanation_records_the_chain_it_runs():
    logits = torch.randn(30, generator=torch.Generator().manual_seed(0))
    history = torch.tensor([2, 5, 5])
    why = explain_sampling(logits, history, ALL_ON, top=30)
    assert [s.name for s in why.steps] == ["logits", *ORDER]
    kept = (~torch.isneginf(filter_logits(logits, history, ALL_ON))).nonzero().flatten()
    assert why.steps[-1].kept == tuple(kept.tolist())


def test_settings_are_not_checked_per_token(monkeypatch):
    """After SamplingParams validated them, neither the sampler nor the explanation checks a
    setting again: a validate that always fails is never reached."""
    params = ALL_ON
    sample = make_sampler(params)

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("validated on a token")

    monkeypatch.setattr(clearlm.sampling.chain, "validate", refuse)
    monkeypatch.setattr(clearlm.sampling.params, "validate", refuse)
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    tokens, _ = sample(logits, torch.tensor([[1, 2], [3, 4]]))
    assert tokens.shape == (2,)
    explain_sampling(logits[0], torch.tensor([1]), params)
    with pytest.raises(AssertionError, match="validated"):  # direct callers are still checked
        apply_top_k(logits, 3)


def test_one_generator_factory():
    a = torch.rand(8, generator=make_generator(123))
    assert torch.equal(a, torch.rand(8, generator=torch.Generator().manual_seed(123)))
    assert not torch.equal(
        torch.rand(8, generator=make_generator(None)), torch.rand(8, generator=make_generator(None))
    )
    # the sampler and the explanation both draw from it: same seed, same pick
    z = torch.randn(100, generator=torch.Generator().manual_seed(5))
    params = SamplingParams(temperature=1.5, seed=11)
    token = int(make_sampler(params)(z, None)[0])
    assert explain_sampling(z, None, params).token == token
    g = make_generator(11)
    assert explain_sampling(z, None, params, generator=g).token == token


def test_one_sampler_type():
    assert clearlm.generation.loop.Sampler is clearlm.sampling.chain.Sampler


def test_the_explanation_keeps_the_chains_output():
    logits = torch.randn(30, generator=torch.Generator().manual_seed(2))
    for params in (ALL_ON, SamplingParams(temperature=0, repetition_penalty=1.3)):
        why = explain_sampling(logits, torch.tensor([4, 7]), params)
        assert torch.equal(why.filtered, filter_logits(logits, torch.tensor([4, 7]), params))


@pytest.mark.parametrize("page", ["README.md", "docs/architecture.md"])
def test_the_stage_tables_state_the_chain_that_runs(page):
    """The stage tables (README.md, docs/architecture.md) name the filters in the order
    sampling_chain runs them, all of them: the README said "the five filters", written before
    OpenAI's frequency and presence penalties joined the chain."""
    text = (Path(__file__).resolve().parents[2] / page).read_text(encoding="utf-8")
    row = next(r for r in text.splitlines() if r.startswith("| 5. softmax + sampling |"))
    stated = row.split("|")[2].split("(")[0].split("→")
    penalties = dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.5)
    every = SamplingParams(
        temperature=0.7, top_k=8, top_p=0.9, min_p=0.05, logit_bias={0: 1.0}, **penalties
    )
    steps = sampling_chain(every, torch.tensor([1]), torch.tensor([1]))
    names = [s.name for s in steps]
    assert [w.strip().replace(" ", "_").replace("-", "_") for w in stated] == [*names, "draw"]
    words = {7: "seven", 8: "eight", 9: "nine"}
    assert f"`sampling/filters.py` (the {words[len(names)]} filters)" in row
