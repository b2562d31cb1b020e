"""The runner's queue of new requests (clearlm.serve.runner): a request is checked in the
caller's thread and joins before the engine's next step, without waiting for the step in
progress; a bad one is refused at the call."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from clearlm.engine import Request, TokenEvent
from clearlm.errors import ContextLengthError
from clearlm.sampling.params import SamplingParams
from clearlm.serve.runner import Runner


class HeldEngine:
    """An engine whose step waits for ``release`` (a step in progress), then gives one token to
    every request it holds; ``check`` refuses an empty prompt, as BatchEngine's does."""

    def __init__(self) -> None:
        self.live: list[str] = []
        self.stepping, self.release = threading.Event(), threading.Event()

    def check(self, request: Request) -> None:
        if not request.prompt:
            raise ContextLengthError("the prompt is empty")

    def add(self, request: Request) -> None:
        self.live.append(request.request_id)

    def abort(self, request_id: str) -> None:
        if request_id in self.live:
            self.live.remove(request_id)

    def has_work(self) -> bool:
        return bool(self.live)

    def step(self) -> list[TokenEvent]:
        self.stepping.set()
        self.release.wait(10)
        events, self.live = [TokenEvent(r, 7, 0.0, finish_reason="length") for r in self.live], []
        return events


def request(rid: str, prompt: list[int]) -> Request:
    return Request(rid, prompt, SamplingParams(temperature=0.0), 1)


def test_add_returns_during_a_step_and_joins_at_the_next() -> None:
    engine, loop = HeldEngine(), asyncio.new_event_loop()
    runner = Runner(engine)
    try:
        runner.add([request("a", [1])], asyncio.Queue(), loop)
        assert engine.stepping.wait(10)  # the engine thread is in a step, holding its lock
        t = time.perf_counter()
        runner.add([request("b", [1, 2])], asyncio.Queue(), loop)
        assert time.perf_counter() - t < 1.0  # it did not wait for the step
        assert engine.live == ["a"]  # b waits for the next step
        engine.release.set()
        deadline = time.monotonic() + 10
        while runner.live() and time.monotonic() < deadline:  # b's step gives its token
            time.sleep(0.01)
        assert runner.live() == 0
    finally:
        engine.release.set()
        runner.stop()
        loop.close()


def test_a_bad_request_is_refused_at_the_call_and_none_is_queued() -> None:
    engine, loop = HeldEngine(), asyncio.new_event_loop()
    runner = Runner(engine)
    try:
        with pytest.raises(ContextLengthError, match="empty"):
            runner.add([request("a", [1]), request("b", [])], asyncio.Queue(), loop)
        assert runner.live() == 0 and runner.adds == []
    finally:
        engine.release.set()
        runner.stop()
        loop.close()
