"""One background thread drives the engine; the server's handlers await their tokens.

The engine is not thread-safe, so exactly one thread calls it, under ``lock``: the runner's
loop (``step()``) and the few callers of :meth:`Runner.exclusive`. Each request has a sink, an
``asyncio.Queue`` on the server's event loop: the runner thread hands it every
:class:`~clearlm.engine.TokenEvent` with ``loop.call_soon_threadsafe``. New requests and aborts
(a stop string, a client that went away) are queued without the lock and applied before the
next step, so a handler never blocks on the engine: a new request joins at the next step and
an aborted one frees its slot within one step. An engine whose ``step`` takes ``emit``
(BatchEngine) gives each first token to the runner as soon as its prompt is prefilled, within
the step, and the runner streams it at once.

Why new requests do not take the lock: a thread waiting for it while the engine thread loops
(release after a step, take it again for the next) was measured waiting 130 ms on average,
1.5 steps of 8 rows (bench/serve_profile.py; a lock is not handed to its waiter, and the
engine thread takes it back first), so a request's slot stood empty and its first token came a
step or two later. The request is checked at once in the caller's thread (the engine's
``check``, which reads only its fixed sizes), so a bad one is still refused at the call; an
engine without ``check`` is given its requests under the lock, as before.
"""

from __future__ import annotations

import asyncio
import inspect
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
        self.adds: list[Request] = []  # checked, waiting for the engine thread
        self.small = threading.Lock()  # guards sinks, adds and aborts; never held in a step
        self.stopping = False
        # an engine whose step takes ``emit`` hands first tokens over as they are made
        self.early = "emit" in inspect.signature(engine.step).parameters
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
        engine refuses raises before any is queued). The engine thread adds them before its
        next step. Call it from a worker thread (``asyncio.to_thread``): an engine without a
        ``check`` method is given them under the lock, which waits for the step in progress.

        Raises:
            RuntimeError: the server is stopping. ClearLMError: what ``engine.check`` (or
            ``engine.add``) raises.
        """
        self.start()
        requests = list(requests)
        check = getattr(self.engine, "check", None)
        if check is None:
            self._add_locked(requests, sink, loop)
            return
        for r in requests:
            check(r)
        with self.small:
            if self.stopping:
                raise RuntimeError("the server is shutting down")
            for r in requests:
                self.sinks[r.request_id] = (loop, sink)
            self.adds.extend(requests)
        self.wake.set()

    def _add_locked(
        self,
        requests: list[Request],
        sink: asyncio.Queue[Item],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """:meth:`add` for an engine that checks a request only in ``add``: under the lock (one
        that the engine refuses aborts those already added, then the error propagates)."""
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
                adds, self.adds = self.adds, []
                aborts, self.aborts = self.aborts, []
            with self.lock:
                for r in adds:  # before the aborts: one may name a request queued here
                    self._engine_add(r)
                for rid in aborts:
                    self.engine.abort(rid)
                if self.stopping:
                    self._fail_all("the server is shutting down", 503, "shutting_down")
                    return
                busy = self.engine.has_work()
                try:
                    events = (self.engine.step(self._deliver) if self.early
                              else self.engine.step()) if busy else []  # fmt: skip
                except Exception as e:  # a bug, or out of memory: fail the live requests
                    log.exception("engine step failed")
                    self._fail_all(f"the engine failed: {type(e).__name__}: {e}")
                    events = []
            for ev in events:
                self._deliver(ev)
            if not busy:
                self.wake.wait()

    def _engine_add(self, request: Request) -> None:
        """Give the engine a checked request (lock held); should it refuse it all the same (an
        id already live), its handler gets the error instead of tokens."""
        try:
            self.engine.add(request)
        except Exception as e:
            with self.small:
                target = self.sinks.pop(request.request_id, None)
            if target is not None:
                _send(target, EngineFailed(f"the engine refused the request: {e}"))

    def _deliver(self, ev: TokenEvent) -> None:
        with self.small:
            target = self.sinks.get(ev.request_id)
            if target is not None and ev.finish_reason is not None:
                del self.sinks[ev.request_id]
        if target is not None:
            _send(target, ev)

    def _fail_all(self, message: str, status: int = 500, code: str = "engine_failed") -> None:
        """Abort every live request in the engine and tell its handler (lock held)."""
        with self.small:
            targets, self.sinks = self.sinks, {}
        for rid, target in targets.items():
            self.engine.abort(rid)
            _send(target, EngineFailed(message, status, code))


def _send(target: tuple[asyncio.AbstractEventLoop, asyncio.Queue[Item]], item: Item) -> None:
    """Put ``item`` on a request's sink from the engine thread (on the sink's own loop)."""
    loop, sink = target
    try:
        loop.call_soon_threadsafe(sink.put_nowait, item)
    except RuntimeError:  # the loop is closed: nobody is listening
        pass
