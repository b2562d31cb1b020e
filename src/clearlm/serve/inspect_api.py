"""``GET /v1/inspect/{id}``: why the server answered what it did (``clearlm serve --inspect``).

With ``--inspect``, every completion's ids are kept when its request ends
(:func:`recorder`, :class:`~clearlm.serve.inspect_store.InspectStore`); the route recomputes
one choice with the served model (:func:`clearlm.serve.inspect_view.inspect_choice`), each
model call under the engine's lock (:meth:`clearlm.serve.runner.Runner.exclusive`), off the
event loop. Query: ``choice`` (default 0), ``top`` alternatives per token (1–20, default 5),
``layers`` (the logit lens rows: ``embed`` and block indices, comma-separated; default all).

Refusals, in OpenAI's error shape: 404 ``inspection_off`` when the server runs without
``--inspect``; 404 ``completion_not_found`` for an id that is unknown, expired, evicted or was
made with another API key (the same answer, so a key cannot learn which ids exist; the id is
quoted up to MAX_ID_SHOWN characters); 409 ``completion_in_progress`` for one of this key's
completions still being generated (a stream still open); 400 for a ``choice``, ``top`` or
``layers`` out of range.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request

from clearlm.api.model import Model
from clearlm.serve.errors import APIError
from clearlm.serve.handler import Session
from clearlm.serve.inspect_store import InspectStore, key_digest
from clearlm.serve.inspect_view import MAX_TOP, check_top, inspect_choice, parse_layers
from clearlm.serve.runner import Runner

PATH = "/v1/inspect/{completion_id}"
MAX_ID_SHOWN = 64  # characters of an unknown id quoted back in the 404 (ours are ~41)


def shown_id(completion_id: str) -> str:
    """The id as a message quotes it: repr, cut to MAX_ID_SHOWN characters and "…"."""
    if len(completion_id) <= MAX_ID_SHOWN:
        return repr(completion_id)
    return repr(completion_id[:MAX_ID_SHOWN]) + "…"


def request_key(request: Request, bearer: Callable[[bytes], bytes | None]) -> bytes:
    """The :func:`key_digest` of the request's ``Authorization: Bearer`` token (or of none)."""
    header = request.headers.get("authorization")
    return key_digest(None if header is None else bearer(header.encode("latin-1")))


def recorder(store: InspectStore, key: bytes) -> Callable[[Session], None]:
    """What keeps a session's ids in ``store`` when it ends: each prompt's ids, and each
    choice's prompt index and generated ids (the token events it already holds). The caller
    marks the session's id pending (``store.begin``) once it has started."""

    def record(session: Session) -> None:
        choices = [(session.prompt_of[c.index], [e.token for e in c.events])
                   for c in session.choices]  # fmt: skip
        store.put(session.id, key, session.job.prompts, choices)

    return record


def add_inspect_route(
    app: FastAPI,
    model: Model,
    runner: Runner,
    store: InspectStore | None,
    name: str,
    bearer: Callable[[bytes], bytes | None],
) -> None:
    """Register ``GET /v1/inspect/{completion_id}`` on ``app`` (it answers 404
    ``inspection_off`` when ``store`` is None)."""

    @app.get(PATH, summary="Inspect a served completion")
    async def inspect_completion(
        request: Request,
        completion_id: str,
        choice: Annotated[int, Query(ge=0, description="The choice's index")] = 0,
        top: Annotated[int, Query(ge=1, le=MAX_TOP, description="Alternatives per token")] = 5,
        layers: Annotated[
            str | None,
            Query(description="Logit lens rows: 'embed' and block indices, comma-separated"),
        ] = None,
    ) -> dict[str, Any]:
        """Per generated token of a kept completion: its probability under the served model,
        the top alternatives and the logit lens (top token per layer)."""
        if store is None:
            raise APIError(404, "completion inspection is off on this server; start it with "
                           "'clearlm serve --inspect' to keep completions for /v1/inspect",
                           code="inspection_off")  # fmt: skip
        check_top(top)
        rows = parse_layers(layers, model.config.n_layers)
        key = request_key(request, bearer)
        record = store.get(completion_id, key)
        if record is None and store.in_progress(completion_id, key):
            raise APIError(409, f"completion {shown_id(completion_id)} is still being "
                           "generated; ask again when its response has ended", "completion_id",
                           "completion_in_progress")  # fmt: skip
        if record is None:
            shown = shown_id(completion_id)
            raise APIError(404, f"no completion {shown} is kept for this API key: unknown, "
                           "made with another key, or dropped (the server keeps the "
                           f"last {store.keep} for {store.ttl_s:g} s)", "completion_id",
                           "completion_not_found")  # fmt: skip
        view = await asyncio.to_thread(
            inspect_choice, model, record, choice, top, rows, runner.exclusive
        )
        return {"id": completion_id, "object": "completion.inspection", "model": name,
                "choices": len(record.choices), **view}  # fmt: skip
