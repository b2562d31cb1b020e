"""One background thread drives the engine; the server's handlers await their tokens.

The engine is not thread-safe, so exactly one thread calls it, under ``lock``: the runner's
loop (``step()``) and, briefly, :meth:`Runner.add` (called from a worker thread, so the event
loop never waits for a step). Each request has a sink, an ``asyncio.Queue`` on the server's
event loop: the runner thread hands it every :class:`~clearlm.engine.TokenEvent` with
``loop.call_soon_threadsafe``. Aborts (a stop string, a client that went away) are queued
without the lock and applied before the next step, so a handler never blocks on the engine and
the slot is freed within one step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from clearlm.engine import Engine, Request, TokenEvent

log = logging.getLogger("clearlm.serve")


class EngineFailed:
    """Put in a sink when the request cannot go on: the engine raised (500 engine_failed) or
    the server is shutting down (503 shutting_down); the message says why."""

    def __init__(self, message: str, status: int = 500, code: str = "engine_failed") -> None:
        self.message, self.status, self.code = message, status, code


Item = TokenEvent | EngineFailed
T = TypeVar("T")


class Runner:
    """Own the engine thread.

    Args:
        engine: anything with the :class:`~clearlm.engine.Engine` methods.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.lock = threading.Lock()  # held for every engine call
        self.wake = threading.Event()  # set when there may be new work
        self.sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Item]]] = {}
        self.aborts: list[str] = []
        self.small = threading.Lock()  # guards sinks and aborts, never held during a step
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="clearlm-engine", daemon=True)

    def start(self) -> None:
        """Start the engine thread (once; :meth:`add` starts it too, for an app run without
        its lifespan events)."""
        with self.small:
            if not self.thread.is_alive() and not self.stopping and self.thread.ident is None:
                self.thread.start()

    def add(
        self,
        requests: Iterable[Request],
        sink: asyncio.Queue[Item],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Queue requests whose events go to ``sink`` on ``loop`` (all or none: one that the
        engine refuses aborts those already added, then the error propagates). Call it from a
        worker thread (``asyncio.to_thread``): it waits for the step in progress.

        Raises:
            RuntimeError: the server is stopping. ClearLMError: what ``engine.add`` raises.
        """
        self.start()
        added: list[str] = []
        with self.lock:
            if self.stopping:
                raise RuntimeError("the server is shutting down")
            try:
                for r in requests:
                    with self.small:
                        self.sinks[r.request_id] = (loop, sink)
                    added.append(r.request_id)
                    self.engine.add(r)
            except BaseException:
                for rid in added:
                    self.engine.abort(rid)
                    with self.small:
                        self.sinks.pop(rid, None)
                raise
        self.wake.set()

    def exclusive(self, fn: Callable[[], T]) -> T:
        """``fn()`` with the engine's lock held, so that no step runs meanwhile (a forward pass
        of the model outside the engine: prompt scoring). Call it from a worker thread."""
        with self.lock:
            return fn()

    def abort(self, request_ids: Iterable[str]) -> None:
        """Stop these requests: no more events reach their sink; the engine drops them before its
        next step. Never blocks on the engine; safe from any thread."""
        with self.small:
            for rid in request_ids:
                if self.sinks.pop(rid, None) is not None:
                    self.aborts.append(rid)
        self.wake.set()

    def live(self) -> int:
        """How many requests still have a sink (running or queued)."""
        with self.small:
            return len(self.sinks)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is left, end the thread and wait for it (at most ``timeout`` seconds)."""
        self.stopping = True
        with self.small:
            self.aborts.extend(self.sinks)
        self.wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout)

    # --- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self.wake.clear()
            with self.small:
                aborts, self.aborts = self.aborts, []
            with self.lock:
                for rid in aborts:
                    self.engine.abort(rid)
                if self.stopping:
                    self._fail_all("the server is shutting down", 503, "shutting_down")
                    return
                busy = self.engine.has_work()
                try:
                    events = self.engine.step() if busy else []
                except Exception as e:  # a bug, or out of memory: fail the live requests
                    log.exception("engine step failed")
                    self._fail_all(f"the engine failed: {type(e).__name__}: {e}")
                    events = []
            for ev in events:
                self._deliver(ev)
            if not busy:
                self.wake.wait()

    def _deliver(self, ev: TokenEvent) -> None:
        with self.small:
            target = self.sinks.get(ev.request_id)
            if target is not None and ev.finish_reason is not None:
                del self.sinks[ev.request_id]
        if target is not None:
            loop, sink = target
            try:
                loop.call_soon_threadsafe(sink.put_nowait, ev)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass

    def _fail_all(self, message: str, status: int = 500, code: str = "engine_failed") -> None:
        """Abort every live request in the engine and tell its handler (lock held)."""
        with self.small:
            targets, self.sinks = self.sinks, {}
        for rid, (loop, sink) in targets.items():
            self.engine.abort(rid)
            try:
                loop.call_soon_threadsafe(sink.put_nowait, EngineFailed(message, status, code))
            except RuntimeError:
                pass
