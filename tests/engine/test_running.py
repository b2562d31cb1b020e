"""Plain greedy rows picked together (clearlm.engine.running.pick_greedy_rows) give the tokens
and logprobs of each row's own sampler (the reference: Running.sample, the chain of
clearlm.sampling), bit for bit, ties and errors included."""

from __future__ import annotations

import pytest
import torch

from clearlm.engine import Request
from clearlm.engine.running import Running, pick_greedy_rows
from clearlm.errors import SamplingError
from clearlm.sampling.params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def rows(n: int) -> list[Running]:
    return [Running(Request(str(i), [1, 2], GREEDY, 3), slot=i) for i in range(n)]


@pytest.mark.parametrize("threads", [1, 2])
def test_greedy_rows_equal_each_rows_sampler(threads: int) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # a (1, V) sum is split across 2 threads: the hard case
    try:
        g = torch.Generator().manual_seed(0)
        for _ in range(3):
            logits = torch.randn(6, 49_152, generator=g) * 4  # (B, V), SmolLM2's vocabulary
            logits[2, 5] = logits[2, 40_000] = logits[2].max() + 1  # a tie: the lowest id
            logits[4, 100:] = float("-inf")
            want = [r.sample(logits[r.slot : r.slot + 1], {5}, 100) for r in rows(6)]
            some = rows(6)[1::2] + rows(6)[::2]  # any order of rows, any slots
            got = {e.request_id: e for e in pick_greedy_rows(some, logits, {5}, 100)}
            for w in want:
                g_ = got[w.request_id]
                assert (g_.token, g_.logprob, g_.finish_reason) == (
                    w.token, w.logprob, w.finish_reason)  # fmt: skip
            assert got["2"].token == 5 and got["2"].finish_reason == "eos"  # an end id
    finally:
        torch.set_num_threads(before)


def test_greedy_rows_refuse_what_the_sampler_refuses() -> None:
    logits = torch.zeros(2, 10)
    logits[1] = float("nan")
    with pytest.raises(SamplingError) as sampler:
        rows(2)[1].sample(logits[1:2], (), 100)
    with pytest.raises(SamplingError) as together:
        pick_greedy_rows(rows(2), logits, (), 100)
    assert str(together.value) == str(sampler.value)
    assert not any(r.plain_greedy for r in [Running(Request("x", [1], GREEDY, 1, 2), 0)])
