"""A request whose grammar the engine gives up on while generating fails alone: a 400 naming
``response_format`` (one line, none of the parser's state), while a stream of another client
that shares the batch goes on to its end with the tokens it gets alone, and the log holds no
traceback; the log line gives each choice's finish_reason as the client receives it."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import pytest
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine.scheduler import BatchEngine
from clearlm.sampling.chain import SamplingParams
from clearlm.serve import create_app
from clearlm.serve.handler import Session
from clearlm.serve.requests import Job
from clearlm.serve.runner import Runner

# '1', or an object whose required "a" is the same object again: usable at the start (no
# token is forced there), given up on once '{' comes (what follows is forced, and endless)
SELF = {"anyOf": [{"const": 1}, {"type": "object", "properties": {"a": {"$ref": "#/anyOf/1"}},
                                 "required": ["a"]}]}  # fmt: skip
FORMAT = {"type": "json_schema", "json_schema": {"name": "x", "schema": SELF}}


class SlowBatchEngine(BatchEngine):
    """The batch engine, 20 ms slower per step: a stream still running when another arrives."""

    def step(self, emit=None):
        time.sleep(0.02)
        return super().step(emit)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    path = write_tiny_llama(tmp_path_factory.mktemp("g") / "t.gguf", context_length=256)
    return clearlm.load(path)


def test_a_grammar_that_fails_fails_its_request_alone(tiny, caplog):
    engine = SlowBatchEngine(tiny.transformer, tiny.tokenizer.eos_ids, max_seq_len=128)
    victim = dict(model="t", prompt="hello world", max_tokens=40, temperature=0)
    brace = tiny.encode("{")[0]
    bad = dict(model="t", prompt="the", max_tokens=10, temperature=0, response_format=FORMAT,
               logit_bias={str(brace): 100})  # fmt: skip
    app = create_app(tiny, engine, model_id="t")
    with caplog.at_level(logging.INFO, "clearlm.serve"), serving(app) as url:
        with httpx.Client(base_url=url, timeout=60) as c:
            alone = c.post("/completions", json=victim).json()["choices"][0]
            lines: list[str] = []
            first = threading.Event()

            def stream() -> None:
                with c.stream("POST", "/completions", json={**victim, "stream": True}) as r:
                    for line in r.iter_lines():
                        lines.append(line)
                        first.set()

            t = threading.Thread(target=stream)
            t.start()
            assert first.wait(30)
            r = c.post("/completions", json=bad)  # while the stream runs (40 steps, ≥ 0.8 s)
            assert t.is_alive()
            t.join(60)
            after = c.post("/completions", json=victim)  # the server goes on serving
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "response_format" and err["type"] == "invalid_request_error"
    assert err["message"].startswith("the grammar cannot be followed: parser error: Too many")
    assert "\n" not in err["message"] and "<state>" not in err["message"]
    events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert not [e for e in events if "error" in e]
    assert "".join(e["choices"][0]["text"] for e in events) == alone["text"]
    assert events[-1]["choices"][0]["finish_reason"] == alone["finish_reason"] == "length"
    assert [x for x in lines if x][-1] == "data: [DONE]"
    assert after.json()["choices"][0]["text"] == alone["text"]
    assert not [rec for rec in caplog.records if rec.exc_info or rec.levelno >= logging.ERROR]
    assert any("finish=error" in rec.getMessage() for rec in caplog.records)


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_the_log_line_gives_the_finish_reason_the_client_gets(tiny, caplog):
    """A choice whose text is a tool call: the response says "tool_calls", and so does the log
    (the engine's reason was "stop")."""
    job = Job(prompts=[[1, 2]], params=[SamplingParams(0)], max_new_tokens=[4], stop=[],
              top_logprobs=0, logprobs=False, echo=[""], stream=False, include_usage=False,
              tools=[WEATHER])  # fmt: skip
    session = Session(Runner(BatchEngine(tiny.transformer)), job, tiny.tokenizer, "chat")
    choice = session.choices[0]
    choice.text, choice.finish_reason = '{"name": "get_weather", "arguments": {}}', "stop"
    with caplog.at_level(logging.INFO, "clearlm.serve"):
        session.log()
    assert session.final("t")["choices"][0]["finish_reason"] == "tool_calls"
    assert "finish=tool_calls" in caplog.text
