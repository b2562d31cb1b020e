"""The uvicorn server ``clearlm serve`` runs: graceful on Ctrl-C / SIGTERM.

uvicorn stops accepting connections on the first signal and waits up to its
``timeout_graceful_shutdown`` for running requests, then cancels them (a bare 500 for a waiting
request, a cut stream). Requests still running ``grace_s`` seconds after the signal are instead
stopped by the runner first, so each gets OpenAI's error shape: 503 ``shutting_down`` (an error
event for a stream).
"""

from __future__ import annotations

import threading
from typing import Any

import uvicorn


class GracefulServer(uvicorn.Server):
    """uvicorn's server, which on the first Ctrl-C / SIGTERM also schedules ``stop_requests``
    after ``grace_s`` seconds (requests that finish sooner are answered normally)."""

    def __init__(self, config: uvicorn.Config, stop_requests: Any, grace_s: float) -> None:
        super().__init__(config)
        self.stop_requests, self.grace_s = stop_requests, grace_s

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.should_exit:
            timer = threading.Timer(self.grace_s, self.stop_requests)
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)
