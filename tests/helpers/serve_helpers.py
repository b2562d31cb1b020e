"""Servers for the tests of ``clearlm serve``: uvicorn in a thread on 127.0.0.1 and a free port,
stopped by the test; and an engine that is slow on purpose (to disconnect mid-stream)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from clearlm.engine import Request, TokenEvent
from clearlm.engine.serial import SerialEngine

START_TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app, grace_s: int | None = None) -> Iterator[str]:
    """Run ``app`` on 127.0.0.1 in a thread; yield its base URL (``http://127.0.0.1:P/v1``).
    On exit the server shuts down gracefully, cancelling requests after ``grace_s`` seconds."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=grace_s)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)


class SlowEngine(SerialEngine):
    """The serial engine, ``delay_s`` slower per step: a long stream to walk away from."""

    def __init__(self, model, eos_ids, delay_s: float) -> None:
        super().__init__(model, eos_ids)
        self.delay_s = delay_s
        self.added: list[Request] = []

    def add(self, request: Request) -> None:
        super().add(request)
        self.added.append(request)

    def step(self) -> list[TokenEvent]:
        time.sleep(self.delay_s)
        return super().step()
