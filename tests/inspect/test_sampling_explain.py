"""Tests for clearlm.inspect.sampling_explain.explain_sampling: each step's kept set and
renormalised probabilities on hand-made logits (the seeds' example 4 and a 10-token vector),
computed by hand here; the pick equals make_sampler's; a token always survives; greedy; rows()."""

from __future__ import annotations

import math

import pytest
import torch

from clearlm.errors import SamplingParamsError
from clearlm.inspect.sampling_explain import SamplingExplanation, explain_sampling
from clearlm.sampling.chain import SamplingParams, filter_logits, make_sampler, softmax

# Example 4 of the seeds README: the right logits and their softmax.
EX4_LOGITS = [0.001, -0.140, 0.537, 0.010, 0.026]
EX4_PROBS = [0.178190, 0.154756, 0.304554, 0.179800, 0.182700]  # ids 0..4
# A 10-token distribution whose ids are not in probability order (sums to 1).
P10 = [0.05, 0.30, 0.01, 0.15, 0.08, 0.20, 0.02, 0.10, 0.06, 0.03]
LOGITS10 = torch.tensor(P10, dtype=torch.float64).log().float()  # softmax(LOGITS10) = P10


def explain(logits, params: SamplingParams, previous=None, **kw) -> SamplingExplanation:
    return explain_sampling(torch.as_tensor(logits, dtype=torch.float32), previous, params, **kw)


def step(e: SamplingExplanation, name: str):
    return next(s for s in e.steps if s.name == name)


def assert_top(got: tuple[tuple[int, float], ...], expected: dict[int, float]) -> None:
    """``got`` lists exactly ``expected``'s ids, most likely first, with its probabilities."""
    want = sorted(expected.items(), key=lambda kv: (-kv[1], kv[0]))
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [p for _, p in got] == pytest.approx([p for _, p in want], abs=1e-6)


def renorm(probs: list[float], ids: list[int]) -> dict[int, float]:
    total = sum(probs[i] for i in ids)
    return {i: probs[i] / total for i in ids}


# --- example 4: one filter at a time ------------------------------------------------------------


def test_example_4_unfiltered():
    e = explain(EX4_LOGITS, SamplingParams(seed=0))
    assert [s.name for s in e.steps] == [
        "logits",
        "repetition_penalty",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
    ]
    assert not any(s.active for s in e.steps)  # defaults are all "off"
    for s in e.steps:
        assert s.kept == (0, 1, 2, 3, 4) and s.removed == ()
        assert_top(s.top, dict(enumerate(EX4_PROBS)))


def test_example_4_top_k_2():
    """The two most likely: 但是 (2) 0.304554 and 呢 (4) 0.182700, renormalised over 0.487254."""
    s = step(explain(EX4_LOGITS, SamplingParams(top_k=2, seed=0)), "top_k")
    assert s.active and s.setting == 2
    assert s.kept == (2, 4) and s.removed == (0, 1, 3)
    assert_top(s.top, {2: 0.304554 / 0.487254, 4: 0.182700 / 0.487254})
    assert s.top[0][1] == pytest.approx(1 / (1 + math.exp(0.026 - 0.537)), abs=1e-6)  # 0.625041


@pytest.mark.parametrize(
    ("p", "kept"),
    [
        # ascending cumulative: ， 0.154756, 。 0.332946, 所以 0.512746, 呢 0.695446, 但是 1
        (0.5, (2, 3, 4)),  # drop cumulative <= 0.5: ， and 。; 但是+呢 = 0.487 < 0.5 needs 所以
        (0.9, (0, 1, 2, 3, 4)),  # nothing <= 0.1: all five are needed to reach 0.9
        (0.3, (2,)),  # 但是 alone holds 0.3046 >= 0.3
    ],
)
def test_example_4_top_p(p, kept):
    s = step(explain(EX4_LOGITS, SamplingParams(top_p=p, seed=0)), "top_p")
    assert s.kept == kept
    assert s.removed == tuple(i for i in range(5) if i not in kept)
    assert_top(s.top, renorm(EX4_PROBS, list(kept)))


@pytest.mark.parametrize(
    ("m", "kept"),
    [
        (0.5, (0, 1, 2, 3, 4)),  # threshold 0.152277: all above
        (0.59, (2, 3, 4)),  # threshold 0.179687: 所以 0.179800 stays, 。 0.178190 goes
        (0.6, (2,)),  # threshold 0.182732: even 呢 0.182700 goes
    ],
)
def test_example_4_min_p(m, kept):
    s = step(explain(EX4_LOGITS, SamplingParams(min_p=m, seed=0)), "min_p")
    assert s.kept == kept
    assert_top(s.top, renorm(EX4_PROBS, list(kept)))


def test_example_4_temperature():
    """T = 0.5 doubles the logits: P ∝ e^{2z} = p²; T = 2 halves them: P ∝ √p."""
    for t, power in ((0.5, 2.0), (2.0, 0.5)):
        s = step(explain(EX4_LOGITS, SamplingParams(temperature=t, seed=0)), "temperature")
        assert s.active and s.kept == (0, 1, 2, 3, 4)
        w = [math.exp(z / t) for z in EX4_LOGITS]
        assert_top(s.top, {i: x / sum(w) for i, x in enumerate(w)})
        powered = [p**power for p in EX4_PROBS]
        assert [p for _, p in s.top] == pytest.approx(
            sorted((x / sum(powered) for x in powered), reverse=True), abs=1e-5
        )


# --- a 10-token vector: the whole chain ---------------------------------------------------------


def test_chain_top_k_then_top_p_then_min_p():
    """top-k 6 keeps 0.30 0.20 0.15 0.10 0.08 0.06 (sum 0.89); top-p 0.8 on those drops 0.06
    and 0.08 (ascending cumulative 0.067, 0.157 <= 0.2; next 0.270), leaving sum 0.75; min-p 0.4
    sets the bar at 0.4 · 0.30/0.75 = 0.16, so 0.10/0.75 = 0.133 goes; 0.65 is left."""
    params = SamplingParams(top_k=6, top_p=0.8, min_p=0.4, seed=0)
    e = explain(LOGITS10, params)
    assert_top(step(e, "temperature").top, dict(enumerate(P10)))
    k = step(e, "top_k")
    assert k.kept == (1, 3, 4, 5, 7, 8) and k.removed == (0, 2, 6, 9)
    assert_top(k.top, renorm(P10, [1, 3, 4, 5, 7, 8]))
    p = step(e, "top_p")
    assert p.kept == (1, 3, 5, 7) and p.removed == (4, 8)
    assert_top(p.top, renorm(P10, [1, 3, 5, 7]))
    assert p.top[0][1] == pytest.approx(0.30 / 0.75, abs=1e-6)
    m = step(e, "min_p")
    assert m.kept == (1, 3, 5) and m.removed == (7,)
    assert_top(m.top, {1: 0.30 / 0.65, 5: 0.20 / 0.65, 3: 0.15 / 0.65})
    assert e.token in m.kept
    assert e.probability == pytest.approx(m.top[[i for i, _ in m.top].index(e.token)][1])


def test_temperature_changes_the_nucleus():
    """At T = 1, top-p 0.8 drops 0.01 0.02 0.03 0.05 0.06 (cumulative 0.17 <= 0.2) and keeps 5.
    At T = 0.5, P ∝ p² (sum 0.1789): ascending cumulative reaches 0.0239/0.1789 = 0.134 <= 0.2
    at 0.10 and 0.2594 at 0.15, so only 0.30, 0.20, 0.15 stay: temperature runs first."""
    warm = step(explain(LOGITS10, SamplingParams(top_p=0.8, seed=0)), "top_p")
    assert warm.kept == (1, 3, 4, 5, 7)
    cold = step(explain(LOGITS10, SamplingParams(temperature=0.5, top_p=0.8, seed=0)), "top_p")
    assert cold.kept == (1, 3, 5)
    assert_top(cold.top, {1: 0.09 / 0.1525, 5: 0.04 / 0.1525, 3: 0.0225 / 0.1525})


def test_repetition_penalty_on_seen_tokens():
    """Logits log p are negative, so penalty 2 doubles them for seen ids 1 and 5 (seen twice:
    penalised once): p1 → 0.30² = 0.09, p5 → 0.20² = 0.04; the rest sum to 0.50; total 0.63."""
    params = SamplingParams(repetition_penalty=2.0, seed=0)
    e = explain(LOGITS10, params, previous=torch.tensor([1, 5, 1]))
    s = step(e, "repetition_penalty")
    assert s.active and s.kept == tuple(range(10)) and s.removed == ()
    expected = {i: p / 0.63 for i, p in enumerate(P10)}
    expected[1], expected[5] = 0.09 / 0.63, 0.04 / 0.63
    assert_top(s.top, expected)
    assert s.top[0][0] == 3  # 0.15 / 0.63 = 0.238 now leads
    no_history = step(explain(LOGITS10, params), "repetition_penalty")
    assert not no_history.active and no_history.top == step(e, "logits").top


def test_top_limits_the_list():
    e = explain(LOGITS10, SamplingParams(top_k=6, seed=0), top=3)
    assert all(len(s.top) == 3 for s in e.steps)
    assert [i for i, _ in step(e, "logits").top] == [1, 5, 3]
    assert len(step(e, "top_k").kept) == 6  # kept is complete whatever `top` is


def test_ties_listed_lowest_id_first():
    s = step(explain([1.0, 2.0, 1.0, 2.0], SamplingParams(seed=0)), "logits")
    assert [i for i, _ in s.top] == [1, 3, 0, 2]


# --- the pick: same as make_sampler --------------------------------------------------------------

PARAMS = [
    SamplingParams(seed=0),
    SamplingParams(temperature=0.7, top_k=20, seed=1),
    SamplingParams(temperature=1.3, top_p=0.9, seed=2),
    SamplingParams(temperature=0.9, min_p=0.05, repetition_penalty=1.3, seed=3),
    SamplingParams(top_k=5, top_p=0.5, min_p=0.2, repetition_penalty=0.8, seed=2**63 + 5),
    SamplingParams(temperature=0, repetition_penalty=1.5),
]


@pytest.mark.parametrize("params", PARAMS)
def test_pick_and_final_distribution_equal_make_sampler(params):
    for trial in range(20):
        g = torch.Generator().manual_seed(trial)
        logits = torch.randn(50, generator=g) * 3  # (V,)
        history = torch.randint(0, 50, (12,), generator=g)  # (S,)
        e = explain_sampling(logits, history, params)
        token, logprob = make_sampler(params)(logits, history)
        assert e.token == int(token)
        assert e.logprob == float(logprob)
        assert e.probability == pytest.approx(math.exp(e.logprob), rel=1e-6)
        filtered = filter_logits(logits, history, params)  # (V,)
        final = e.steps[-1]
        assert final.kept == tuple(torch.isfinite(filtered).nonzero().flatten().tolist())
        probs = softmax(filtered)
        assert all(p == float(probs[i]) for i, p in final.top)


def test_shared_generator_follows_the_sampler_stream():
    """With the generator passed in, successive explanations make a sampler's successive draws."""
    params = SamplingParams(temperature=1.5, seed=7)
    logits = torch.randn(30, generator=torch.Generator().manual_seed(0))
    sampler = make_sampler(params)
    g = torch.Generator().manual_seed(7)
    for _ in range(10):
        assert explain_sampling(logits, None, params, generator=g).token == int(
            sampler(logits, None)[0]
        )


def test_example_4_draw_matches_a_fresh_sampler():
    z = torch.tensor(EX4_LOGITS)
    for seed in range(10):
        params = SamplingParams(top_p=0.5, seed=seed)
        assert explain_sampling(z, None, params).token == int(make_sampler(params)(z, None)[0])


# --- a token always survives ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=1, seed=0),
        SamplingParams(top_p=1e-9, seed=0),
        SamplingParams(min_p=1.0, seed=0),
        SamplingParams(temperature=1e-3, top_k=1, top_p=1e-9, min_p=1.0, seed=0),
        SamplingParams(temperature=100.0, top_p=1e-9, repetition_penalty=50.0, seed=0),
    ],
)
def test_at_least_one_token_survives(params):
    for logits in (LOGITS10, torch.zeros(10), torch.tensor([5.0, -math.inf, 5.0, 1.0])):
        e = explain(logits, params, previous=torch.tensor([0, 1, 2]))
        before = set(e.steps[0].kept)
        for s in e.steps:
            assert len(s.kept) >= 1 and len(s.top) >= 1
            assert set(s.kept) | set(s.removed) == before and not set(s.kept) & set(s.removed)
            before = set(s.kept)
            assert sum(p for _, p in s.top) <= 1 + 1e-6
        assert e.token in e.steps[-1].kept


# --- greedy ---------------------------------------------------------------------------------------


def test_greedy_picks_the_argmax_lowest_id_on_ties():
    e = explain([1.0, 3.0, 0.0, 3.0], SamplingParams(temperature=0))
    assert [s.name for s in e.steps] == ["logits", "repetition_penalty"]  # no warpers
    assert e.token == 1
    assert e.probability == pytest.approx(math.exp(3) / (math.e + 2 * math.exp(3) + 1), abs=1e-6)
    assert explain(EX4_LOGITS, SamplingParams(temperature=0)).token == 2  # 但是


def test_greedy_after_the_penalty():
    """Token 0 (logit 2.0) was seen: penalty 2 makes it 1.0, so 1 (1.5) becomes the argmax."""
    params = SamplingParams(temperature=0, repetition_penalty=2.0)
    e = explain([2.0, 1.5, 0.1], params, previous=torch.tensor([0]))
    assert e.token == 1
    w = [math.exp(1.0), math.exp(1.5), math.exp(0.1)]
    assert e.probability == pytest.approx(w[1] / sum(w), abs=1e-6)
    assert explain([2.0, 1.5, 0.1], params).token == 0


# --- rows and validation ------------------------------------------------------------------------


def test_rows_are_plain_data():
    words = ["。", "，", "但是", "所以", "呢"]
    e = explain(EX4_LOGITS, SamplingParams(top_k=2, seed=3))
    rows = e.rows(words)
    assert len(rows) == len(e.steps) + 1
    assert all(set(r) == {"step", "setting", "active", "kept", "removed", "top"} for r in rows)
    top_k = rows[3]
    assert (top_k["step"], top_k["setting"], top_k["kept"], top_k["removed"]) == ("top_k", 2, 2, 3)
    assert [t["label"] for t in top_k["top"]] == ["但是", "呢"]
    last = rows[-1]
    assert last["step"] == "draw" and last["setting"] == 3
    assert last["top"] == [{"id": e.token, "label": words[e.token], "p": e.probability}]
    assert e.rows()[0]["top"][0]["label"] == "2"
    greedy_rows = explain(EX4_LOGITS, SamplingParams(temperature=0)).rows(words)
    assert greedy_rows[-1]["step"] == "greedy" and greedy_rows[-1]["top"][0]["label"] == "但是"


def test_validation():
    with pytest.raises(ValueError, match="shape"):
        explain_sampling(torch.zeros(2, 5), None, SamplingParams())
    with pytest.raises(SamplingParamsError, match="top must be"):
        explain_sampling(torch.zeros(5), None, SamplingParams(), top=0)
