"""Clients that leave early: a non-streaming request whose client gave up frees its slot within
about POLL_S even while tokens keep coming, and a body cut short is one 400 with no traceback
in the server's log (both found by a bad-input run of ``clearlm serve``)."""

from __future__ import annotations

import json
import logging
import socket
import time

import httpx
import pytest
from serve_helpers import SlowEngine, serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.serve import create_app
from clearlm.serve.handler import POLL_S

MODEL = "tiny"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("d") / "t.gguf",
                                         context_length=256))


def wait_idle(engine, app, limit_s: float) -> float:
    """Seconds until the engine has no work and no request is live; fails past limit_s."""
    t0 = time.monotonic()
    while engine.has_work() or app.state.runner.live():
        assert time.monotonic() - t0 < limit_s, "the abandoned request still holds the engine"
        time.sleep(0.01)
    return time.monotonic() - t0


def test_a_non_streaming_client_that_gives_up_frees_its_slot(tiny):
    """200 tokens at 0.02 s a step would hold the engine 4 s; tokens arrive every 20 ms, far
    more often than POLL_S, which is when the check used to be skipped."""
    engine = SlowEngine(tiny.transformer, tiny.tokenizer.eos_ids, delay_s=0.02)
    app = create_app(tiny, engine, model_id=MODEL)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 200, "temperature": 0}
    with serving(app) as u:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{u}/completions", json=body, timeout=0.5)  # the client gives up
        assert wait_idle(engine, app, limit_s=POLL_S + 1.5) < POLL_S + 1.5
        r = httpx.post(f"{u}/completions", json={**body, "max_tokens": 3}, timeout=30)
        assert r.status_code == 200 and len(engine.added) == 2


def test_a_body_cut_short_is_a_400_without_a_traceback(tiny, caplog):
    app = create_app(tiny, model_id=MODEL)
    uvicorn_log = logging.getLogger("uvicorn.error")  # uvicorn's loggers do not propagate
    with serving(app) as u:  # (its logging set-up at the start drops handlers added before)
        uvicorn_log.addHandler(caplog.handler)
        try:
            port = int(u.split(":")[2].split("/")[0])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                          b'{"model":')  # then the client hangs up: 91 bytes never come
                time.sleep(0.3)  # (closing at once, the server may not have begun the request)
            time.sleep(0.5)
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}
            r = httpx.post(f"{u}/completions", content=json.dumps(body), timeout=30)
            assert r.status_code == 200  # still serving
        finally:
            uvicorn_log.removeHandler(caplog.handler)
    assert not [rec for rec in caplog.records if "Exception in ASGI" in rec.getMessage()]
