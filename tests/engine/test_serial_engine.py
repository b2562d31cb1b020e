"""SerialEngine keeps the Engine contract: FIFO, one token per step, tokens equal to the
single-sequence generator's, finish reasons, abort of running and queued requests, refusals."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine import Request
from clearlm.engine.serial import SerialEngine
from clearlm.errors import ContextLengthError, GrammarError, SamplingParamsError
from clearlm.generation.grammar import grammar_state
from clearlm.generation.loop import generate_step
from clearlm.sampling.chain import SamplingParams, make_sampler
from clearlm.sampling.grammar import compile_grammar_text

CTX = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    return clearlm.load(
        write_tiny_llama(tmp_path_factory.mktemp("se") / "t.gguf", context_length=CTX)
    )


def drain(engine: SerialEngine) -> list:
    events = []
    while engine.has_work():
        step = engine.step()
        assert len(step) == 1  # one token of one request per step
        events += step
    return events


def test_fifo_tokens_equal_generate_step_and_finish_reasons(tiny):
    engine = SerialEngine(tiny.transformer, eos_ids=[])
    p1 = SamplingParams(temperature=0.9, seed=4, presence_penalty=0.7, repetition_penalty=1.2)
    p2 = SamplingParams(temperature=0)
    engine.add(Request("a", [1, 2, 3], p1, 5))
    engine.add(Request("b", list(range(10, 40)), p2, 50))  # 30 tokens: room for 2 more
    events = drain(engine)
    assert [e.request_id for e in events] == ["a"] * 5 + ["b"] * 2
    want_a = list(generate_step(tiny.transformer, [1, 2, 3], make_sampler(p1), 5))
    assert [(e.token, e.logprob) for e in events[:5]] == [
        (t, pytest.approx(lp, abs=1e-6)) for t, lp in want_a
    ]
    assert [e.finish_reason for e in events] == [None] * 4 + ["length", None, "context_length"]


def test_eos_ends_a_request_and_top_logprobs_are_sorted(tiny):
    first = SerialEngine(tiny.transformer, eos_ids=[])
    first.add(Request("x", [5, 6], SamplingParams(temperature=0), 3, top_logprobs=4))
    ev = first.step()[0]
    assert len(ev.top_logprobs) == 4 and ev.top_logprobs[0][0] == ev.token  # greedy: the top
    values = [lp for _, lp in ev.top_logprobs]
    assert values == sorted(values, reverse=True)
    logits = tiny.logits([5, 6])[-1]  # (V,)
    assert values[0] == pytest.approx(float(torch.log_softmax(logits.float(), -1).max()), abs=1e-5)
    engine = SerialEngine(tiny.transformer, eos_ids=[ev.token])  # that token now ends it
    engine.add(Request("x", [5, 6], SamplingParams(temperature=0), 3))
    assert [e.finish_reason for e in drain(engine)] == ["eos"]


def test_abort_running_and_queued(tiny):
    engine = SerialEngine(tiny.transformer, eos_ids=[])
    for rid in "abc":
        engine.add(Request(rid, [1, 2], SamplingParams(temperature=0), 10))
    assert engine.step()[0].request_id == "a"
    engine.abort("a")  # running
    engine.abort("c")  # queued
    engine.abort("zzz")  # unknown: ignored
    events = drain(engine)
    assert {e.request_id for e in events} == {"b"} and len(events) == 10
    assert not engine.has_work() and engine.step() == []


@pytest.mark.parametrize(
    ("request_", "error", "needle"),
    [
        (Request("e", [], SamplingParams(), 3), ContextLengthError, "empty"),
        (Request("e", [1] * CTX, SamplingParams(), 3), ContextLengthError, "no room"),
        (Request("e", [1], SamplingParams(), 0), SamplingParamsError, "max_new_tokens"),
        (Request("e", [10**6], SamplingParams(), 3), SamplingParamsError, "vocabulary"),
        (Request("dup", [1], SamplingParams(), 3), SamplingParamsError, "already running"),
    ],
)
def test_refusals_before_queuing(tiny, request_, error, needle):
    engine = SerialEngine(tiny.transformer, eos_ids=[])
    engine.add(Request("dup", [1], SamplingParams(), 3))
    with pytest.raises(error, match=needle):
        engine.add(request_)
    assert len(engine.queue) == 1


def test_a_grammar_that_fails_ends_that_request_and_the_next_runs(tiny):
    """'b' (logit_bias) then endless 'a's: the grammar engine gives up at the second token;
    that request ends with an "error" event and the queued one still gets its tokens."""
    b = tiny.encode("b")[0]
    grammar = compile_grammar_text('root ::= "x" | "b" inf\ninf ::= "a" inf')
    state = grammar_state(tiny.tokenizer, tiny.config.vocab_size, grammar)
    engine = SerialEngine(tiny.transformer, eos_ids=[])
    engine.add(Request("bad", [1, 2], SamplingParams(0, logit_bias={b: 100.0}), 6, grammar=state))
    engine.add(Request("ok", [1, 2, 3], SamplingParams(temperature=0), 3))
    events = drain(engine)
    assert [(e.request_id, e.token, e.finish_reason) for e in events[:2]] == [
        ("bad", b, None), ("bad", -1, "error")]  # fmt: skip
    assert isinstance(events[1].error, GrammarError)
    assert [e.token for e in events[2:]] == tiny.generate([1, 2, 3], 3, temperature=0).tokens
