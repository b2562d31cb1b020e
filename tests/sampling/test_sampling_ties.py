"""Ties in the sampling filters: "ties go to the lowest id" wherever the kept set depends on tie
order (top-p), and equality with transformers' processors wherever it does not.

The reference for which ids stay is written out here independently, in float64 Python: sort by
(probability descending, id ascending) and keep each token while the mass of the tokens before
it is below p. That is HF's rule ("drop ascending cumulative <= 1 - p") with ties ordered.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from clearlm.inspect.sampling_explain import explain_sampling
from clearlm.sampling.chain import (
    SamplingParams,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    filter_logits,
    softmax,
)


def nucleus_lowest_ids(logits: list[float], p: float) -> tuple[set[int], float]:
    """Kept ids by the rule above, and the smallest distance between p and a prefix mass (how
    close the case is to a float rounding decision)."""
    m = max(logits)
    w = [math.exp(z - m) for z in logits]
    probs = [x / sum(w) for x in w]
    order = sorted(range(len(logits)), key=lambda i: (-probs[i], i))
    kept, before, margin = set(), 0.0, math.inf
    for i in order:
        margin = min(margin, abs(before - p))
        if before < p or not kept:
            kept.add(i)
        before += probs[i]
    return kept, margin


def kept(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


# --- the inputs -------------------------------------------------------------------------


def test_top_p_tie_of_four_keeps_ids_0_and_1() -> None:
    expected, _ = nucleus_lowest_ids([0.0] * 4, 0.5)
    assert expected == {0, 1}
    probs = softmax(apply_top_p(torch.zeros(4), 0.5))
    assert probs.tolist() == [0.5, 0.5, 0.0, 0.0]


def test_top_p_tie_of_eight_keeps_ids_0_to_5() -> None:
    expected, _ = nucleus_lowest_ids([0.0] * 8, 0.75)
    assert expected == set(range(6))
    assert kept(apply_top_p(torch.zeros(8), 0.75)) == set(range(6))
    # the same count as transformers keeps; transformers' ids are the other end of the tie
    hf = TopPLogitsWarper(0.75)(None, torch.zeros(1, 8))[0]
    assert len(kept(hf)) == 6


# --- the kind: tie-heavy logits -----------------------------------------------------------------


def tie_heavy(seed: int, batch: int = 64, vocab: int = 12) -> torch.Tensor:
    """Logits drawn from five values, so that most rows hold ties; some entries are -inf."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor([-2.0, -1.0, 0.0, 0.5, 1.0])
    logits = levels[torch.randint(0, 5, (batch, vocab), generator=g)]  # (B, V)
    logits[::7, ::5] = -math.inf
    return logits


@pytest.mark.parametrize("p", [0.1, 0.3, 0.45, 0.6, 0.77, 0.9, 0.97])
def test_top_p_keeps_the_lowest_ids_of_a_tie_and_matches_hf_elsewhere(p: float) -> None:
    logits = tie_heavy(int(p * 100))
    ours = apply_top_p(logits, p)
    hf = TopPLogitsWarper(p)(None, logits.clone())
    straddled = 0
    for row, o, h in zip(logits, ours, hf, strict=True):
        want, margin = nucleus_lowest_ids(row.tolist(), p)
        if margin < 1e-6:  # float rounding decides (as in HF); the tie rule is not at stake
            continue
        assert kept(o) == want
        assert len(kept(o)) == len(kept(h))  # the counts agree with transformers
        # Where every group of equal logits is kept whole or dropped whole, the kept set does
        # not depend on tie order: then ours equals transformers' exactly.
        groups = {}
        for i, z in enumerate(row.tolist()):
            groups.setdefault(z, set()).add(i)
        if all(g <= kept(h) or not (g & kept(h)) for g in groups.values()):
            assert torch.equal(o, h)
        else:
            straddled += 1
            assert kept(o) != kept(h)  # HF keeps other ids of the straddling tie
    assert straddled > 0  # the batch does exercise the tie rule


@pytest.mark.parametrize("k", [1, 2, 3, 5, 11])
def test_top_k_keeps_whole_ties_as_hf(k: int) -> None:
    logits = tie_heavy(100 + k)
    assert torch.equal(apply_top_k(logits, k), TopKLogitsWarper(k)(None, logits.clone()))


@pytest.mark.parametrize("m", [0.1, 0.4, 0.61, 1.0])
def test_min_p_is_a_threshold_equal_to_hf_on_ties(m: float) -> None:
    logits = tie_heavy(200 + int(m * 10))
    assert torch.equal(apply_min_p(logits, m), MinPLogitsWarper(m)(None, logits.clone()))


def test_the_chain_and_its_explanation_keep_the_lowest_ids() -> None:
    params = SamplingParams(top_k=6, top_p=0.5, seed=0)
    logits = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 0.0])  # four tied at the top, each 0.211
    want, _ = nucleus_lowest_ids(logits.tolist(), 0.5)
    assert want == {1, 2, 3}  # 0.422 < 0.5 <= 0.633
    assert kept(filter_logits(logits, None, params)) == want
    e = explain_sampling(logits, None, params)
    assert e.steps[-2].name == "top_p" and e.steps[-2].kept == (1, 2, 3)
    assert e.token in want
