"""The continuous-batching engine: requests that join a running batch, aborts that free a slot
for a queued request, chunked prefill, top_logprobs and finish reasons, each checked against
the same prompt run alone (clearlm.generation.loop, one sequence, no engine)."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine import Request
from clearlm.engine.scheduler import BatchEngine
from clearlm.errors import ClearLMError, ContextLengthError, GrammarError, SamplingParamsError
from clearlm.generation.grammar import grammar_state
from clearlm.sampling.chain import SamplingParams
from clearlm.sampling.grammar import compile_grammar_text

GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=0.9, top_k=40, seed=123)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("eng") / "t.gguf"))


def prompt(tiny, text: str) -> list[int]:
    return tiny.encode(text)


def alone(tiny, ids: list[int], params: SamplingParams, n: int) -> list[int]:
    return tiny.generate(ids, max_new_tokens=n, params=params).tokens


def run(engine: BatchEngine, joins: dict[int, list[Request]] | None = None) -> dict:
    """Step until done; requests in joins[k] are added before step k. Returns id → tokens,
    plus the per-step events under key "steps"."""
    out: dict = {"steps": []}
    k = 0
    while engine.has_work() or (joins and any(s >= k for s in joins)):
        for r in (joins or {}).get(k, []):
            engine.add(r)
        events = engine.step()
        out["steps"].append(events)
        for e in events:
            out.setdefault(e.request_id, []).append(e.token)
        k += 1
    return out


def test_requests_joining_mid_run_equal_their_runs_alone(tiny):
    a, b, c = (prompt(tiny, t) for t in ("hello world", "the quick brown fox", "x y"))
    engine = BatchEngine(tiny.transformer, max_batch=2, max_seq_len=64)
    got = run(
        engine,
        {
            0: [Request("a", a, GREEDY, 12)],
            3: [Request("b", b, SAMPLED, 8), Request("c", c, SAMPLED, 6)],  # c waits for a slot
        },
    )
    assert got["a"] == alone(tiny, a, GREEDY, 12)
    assert got["b"] == alone(tiny, b, SAMPLED, 8)
    assert got["c"] == alone(tiny, c, SAMPLED, 6)
    assert not engine.has_work() and engine.free_slots == [0, 1]
    assert engine.cache.lengths.tolist() == [0, 0]


def test_abort_frees_the_slot_for_a_queued_request(tiny):
    a, b = prompt(tiny, "hello world"), prompt(tiny, "abc")
    engine = BatchEngine(tiny.transformer, max_batch=1, max_seq_len=64)
    engine.add(Request("a", a, GREEDY, 50))
    engine.add(Request("b", b, GREEDY, 5))
    for _ in range(3):
        assert {e.request_id for e in engine.step()} == {"a"}  # b is queued: one slot
    engine.abort("a")
    assert engine.free_slots == [0] and "a" not in engine.running
    events = engine.step()  # b takes the slot and is prefilled at once
    assert [e.request_id for e in events] == ["b"]
    got = run(engine)
    assert [events[0].token, *got["b"]] == alone(tiny, b, GREEDY, 5)
    engine.abort("nobody")  # unknown (or finished) ids: nothing happens


def test_chunked_prefill_equals_whole_prefill_and_decodes_keep_going(tiny):
    long = prompt(tiny, "Alice was beginning to get very tired of sitting by her sister")
    short = prompt(tiny, "hi")
    engine = BatchEngine(tiny.transformer, max_batch=2, max_seq_len=64, prefill_chunk=8)
    got = run(engine, {0: [Request("s", short, GREEDY, 20)], 2: [Request("l", long, GREEDY, 6)]})
    assert got["l"] == alone(tiny, long, GREEDY, 6)
    assert got["s"] == alone(tiny, short, GREEDY, 20)
    chunks = -(-len(long) // 8)
    assert chunks >= 3
    # while the long prompt is prefilled chunk by chunk, the short request gets a token per step
    for events in got["steps"][2 : 2 + chunks - 1]:
        assert [e.request_id for e in events] == ["s"]


def test_top_logprobs_are_the_model_distribution(tiny):
    ids = prompt(tiny, "hello world")
    engine = BatchEngine(tiny.transformer, max_seq_len=64)
    engine.add(Request("a", ids, GREEDY, 1, top_logprobs=5))
    (event,) = engine.step()
    ref = torch.log(tiny.next_token_distribution(ids))  # (V,)
    top = torch.argsort(ref, descending=True, stable=True)[:5].tolist()
    assert [t for t, _ in event.top_logprobs] == top and event.token == top[0]
    for t, lp in event.top_logprobs:
        assert abs(lp - ref[t].item()) < 1e-4
    assert abs(event.logprob - ref[top[0]].item()) < 1e-4
    assert event.finish_reason == "length"


def test_finish_reasons(tiny):
    ids = prompt(tiny, "hello world")
    free = alone(tiny, ids, GREEDY, 6)
    # the third greedy token declared an end id: the request ends there with "eos"
    engine = BatchEngine(tiny.transformer, eos_ids={free[2]}, max_seq_len=64)
    engine.add(Request("eos", ids, GREEDY, 6))
    engine.add(Request("len", ids, GREEDY, 2))
    got = run(engine)
    reasons = {e.request_id: e.finish_reason for s in got["steps"] for e in s if e.finish_reason}
    assert got["eos"] == free[: free.index(free[2]) + 1] and reasons["eos"] == "eos"
    assert got["len"] == free[:2] and reasons["len"] == "length"
    # a slot of len(ids) + 3 positions: three tokens, then the context is full
    engine = BatchEngine(tiny.transformer, max_seq_len=len(ids) + 3)
    engine.add(Request("ctx", ids, GREEDY, 10))
    got = run(engine)
    assert got["ctx"] == free[:3] and got["steps"][-1][0].finish_reason == "context_length"


def test_bad_requests_are_refused_before_queuing(tiny):
    engine = BatchEngine(tiny.transformer, max_seq_len=16)
    engine.add(Request("a", [5, 6], GREEDY, 1))
    with pytest.raises(ClearLMError, match="already queued or running"):
        engine.add(Request("a", [5, 6], GREEDY, 1))
    with pytest.raises(ContextLengthError, match="empty"):
        engine.add(Request("b", [], GREEDY, 1))
    with pytest.raises(ContextLengthError, match="holds 16 per sequence"):
        engine.add(Request("b", list(range(3, 19)), GREEDY, 1))
    with pytest.raises(ClearLMError, match="outside the vocabulary"):
        engine.add(Request("b", [5, 10**6], GREEDY, 1))
    with pytest.raises(SamplingParamsError, match="max_new_tokens must be an integer ≥ 1"):
        engine.add(Request("b", [5], GREEDY, 0))
    with pytest.raises(SamplingParamsError, match="top_logprobs"):
        engine.add(Request("b", [5], GREEDY, 1, top_logprobs=-1))
    with pytest.raises(SamplingParamsError, match="max_batch must be an integer ≥ 1"):
        BatchEngine(tiny.transformer, max_batch=0)
    assert len(engine.queue) == 1


def test_finish_reason_is_one_rule_eos_then_length_then_context() -> None:
    """generation.stops.finish_reason decides for the loop and both engines: an end id wins
    over the token limit, which wins over a full context (all three hold at once here)."""
    from clearlm.generation.stops import finish_reason

    assert finish_reason(2, {2}, 4, 4, 10, 10) == "eos"
    assert finish_reason(5, {2}, 4, 4, 10, 10) == "length"
    assert finish_reason(5, {2}, 3, 4, 10, 10) == "context_length"
    assert finish_reason(5, {2}, 3, 4, 9, 10) is None
    assert finish_reason(None, (), 4, 4, 5, 10) == "length"  # the loop's end, no token


def test_emit_hands_each_first_token_over_before_the_next_prefill(tiny):
    a, b = prompt(tiny, "hello world"), prompt(tiny, "the quick brown fox")
    engine = BatchEngine(tiny.transformer, max_batch=2, max_seq_len=64)
    engine.add(Request("a", a, GREEDY, 5))
    engine.add(Request("b", b, GREEDY, 1))  # its first token is its last: released all the same
    seen: list = []
    got: dict = {}

    def emit(event) -> None:  # b's prompt is not in yet when a's first token comes
        seen.append((event.request_id, engine.running["b"].cached))
        got.setdefault(event.request_id, []).append(event.token)

    assert engine.step(emit) == []  # nothing was decoding: every event went through emit
    assert seen == [("a", 0), ("b", len(b))]
    while engine.has_work():
        for e in engine.step(emit):
            got.setdefault(e.request_id, []).append(e.token)
    assert got["a"] == alone(tiny, a, GREEDY, 5) and got["b"] == alone(tiny, b, GREEDY, 1)
    assert engine.free_slots == [0, 1]


# 'b' and then 'a' forever: the engine gives up when the first forced 'a' comes (the grammar
# is usable up to there: GrammarState's check at creation sees no forced token)
ENDLESS_AFTER_B = 'root ::= "x" | "b" inf\ninf ::= "a" inf'


def failing_grammar_request(tiny, rid: str, ids: list[int]) -> Request:
    """A greedy request whose grammar fails at its second token (logit_bias picks 'b')."""
    b = tiny.encode("b")[0]
    state = grammar_state(tiny.tokenizer, tiny.config.vocab_size,
                          compile_grammar_text(ENDLESS_AFTER_B))  # fmt: skip
    params = SamplingParams(temperature=0, logit_bias={b: 100.0})
    return Request(rid, ids, params, 8, grammar=state)


def test_a_grammar_that_fails_ends_its_own_sequence_and_the_batch_goes_on(tiny):
    """Two sequences in one batch, one whose grammar cannot be followed: that one ends with an
    "error" event (the GrammarError, one line, no token), the other's tokens equal its run
    alone, and both slots are free afterwards."""
    a, b = prompt(tiny, "hello world"), prompt(tiny, "the quick brown fox")
    engine = BatchEngine(tiny.transformer, max_batch=2, max_seq_len=64)
    got = run(engine, {0: [failing_grammar_request(tiny, "bad", a), Request("ok", b, SAMPLED, 10)]})
    assert got["ok"] == alone(tiny, b, SAMPLED, 10)
    assert got["bad"] == [tiny.encode("b")[0], -1]  # 'b', then the failing step
    last = [e for step in got["steps"] for e in step if e.request_id == "bad"][-1]
    assert last.finish_reason == "error" and isinstance(last.error, GrammarError)
    message = str(last.error)
    assert message.startswith("the grammar cannot be followed: parser error: Too many items")
    assert "\n" not in message and "<state>" not in message and "inf" not in message
    assert engine.free_slots == [0, 1] and not engine.has_work()


def test_a_grammar_that_fails_in_a_list_of_prompts_names_its_prompt(tiny):
    """model.generate([...]) is one call: a row's failing grammar is the call's error."""
    from clearlm.engine.batch import generate_batch

    bad = failing_grammar_request(tiny, "1", [3, 4])
    with pytest.raises(GrammarError, match="^prompt 1: the grammar cannot be followed"):
        generate_batch(tiny.transformer, tiny.tokenizer, [[1, 2], [3, 4]], [GREEDY, bad.params],
                       [4, 4], [[], []], [None, compile_grammar_text(ENDLESS_AFTER_B)])
