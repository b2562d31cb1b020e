"""The OpenAI-compatible HTTP API of ``clearlm serve`` (FastAPI).

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions``,
``POST /v1/chat/completions`` (``stream: true`` gives server-sent events ending with
``data: [DONE]``), ``GET /v1/inspect/{id}`` (with ``inspect``: a served completion's tokens,
alternatives and logit lens, :mod:`clearlm.serve.inspect_api`), ``GET /openapi.json`` (the
API's OpenAPI description: :mod:`clearlm.serve.openapi`). The app only parses, checks and
shapes; generation is the engine's, driven by one :class:`~clearlm.serve.runner.Runner`
thread. The engine is an argument: the continuous-batching
:class:`~clearlm.engine.scheduler.BatchEngine` by default, or any object with the
:class:`~clearlm.engine.Engine` methods (the one-at-a-time
:class:`~clearlm.engine.serial.SerialEngine` serves as the unbatched reference in tests).

Every refusal is OpenAI's error shape (:mod:`clearlm.serve.errors`): 400 for bad input (a body
that is not UTF-8 or JSON, over ``max_body`` bytes, unknown or mistyped fields, values out of
range, a prompt longer than the context), 401 for a missing or wrong API key (every route
requires it when the server has one, /health included), 404 for an unknown route or an unknown
``model`` (code ``model_not_found``, as OpenAI answers).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib.metadata
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from clearlm.api.model import Model
from clearlm.engine import Engine
from clearlm.engine.scheduler import build_engine
from clearlm.serve.errors import APIError
from clearlm.serve.handler import Session
from clearlm.serve.inspect_api import add_inspect_route, recorder, request_key
from clearlm.serve.inspect_store import InspectStore
from clearlm.serve.logprobs import score_prompt
from clearlm.serve.openapi import openapi_schema
from clearlm.serve.requests import Limits, chat_job, completion_job
from clearlm.serve.runner import Runner
from clearlm.serve.schemas import ChatBody, CompletionBody, error_code, parse

MAX_BODY = 1 << 20  # bytes: 1 MiB


def bearer_token(header: bytes) -> bytes | None:
    """The credentials of an ``Authorization: Bearer <token>`` header, or None for another
    scheme. The scheme is case-insensitive and followed by one or more spaces (RFC 7235,
    section 2.1: ``credentials = auth-scheme [ 1*SP token68 ]``), so ``bearer KEY`` counts."""
    scheme, _, token = header.partition(b" ")
    return token.lstrip(b" ") if scheme.lower() == b"bearer" else None


class BearerAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer <key>`` (401 else).
    Pure ASGI (not BaseHTTPMiddleware) so that streaming and disconnects pass through as is."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app, self.expected = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            token = bearer_token(dict(scope["headers"]).get(b"authorization", b""))
            if token is None or not hmac.compare_digest(token, self.expected):
                err = APIError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                               code="invalid_api_key")  # fmt: skip
                await err.response({"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SessionStream(StreamingResponse):
    """A streamed response that aborts its session's choices however it ends (a client that
    disconnects cancels the stream: its slots are freed at once)."""

    def __init__(self, session: Session, model_id: str) -> None:
        super().__init__(session.stream(model_id), media_type="text/event-stream")
        self.session = session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.session.close()


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (400) as soon as it passes ``limit`` bytes."""
    too_big = APIError(400, f"the body is over the server's limit of {limit} bytes (the "
                       "server's --max-body option sets it)", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    parts, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            parts.append(chunk)
    except ClientDisconnect:  # nobody reads the answer; no traceback in the log for it
        raise APIError(400, "the client disconnected before sending the whole body",
                       code="client_disconnected") from None
    return b"".join(parts)


def system_fingerprint(model: Model) -> str:
    """OpenAI's ``system_fingerprint``: ``fp_`` and 10 hex digits that change when the code's
    version, the model file or the way it is held in memory changes (the settings that can
    change an answer for the same request and seed)."""
    try:
        version = importlib.metadata.version("clearlm")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "source"
    what = f"{version} {model.path} {model.weights} {model.activations}"
    return "fp_" + hashlib.sha256(what.encode()).hexdigest()[:10]


def create_app(
    model: Model,
    engine: Engine | None = None,
    *,
    model_id: str | None = None,
    api_key: str | None = None,
    max_body: int = MAX_BODY,
    limits: Limits | None = None,
    any_model: bool = False,
    inspect: InspectStore | None = None,
) -> FastAPI:
    """The app serving ``model`` through ``engine``.

    Args:
        model: the loaded model (tokenizer, chat template, context length).
        engine: an :class:`~clearlm.engine.Engine`; default a continuous-batching
            ``BatchEngine`` on the model.
        model_id: the name requests give as ``model``; default the model file's name.
        api_key: when set, every request needs ``Authorization: Bearer <api_key>``.
        max_body: the largest request body accepted, in bytes.
        limits: per-request limits (``n``).
        any_model: serve the model under whatever ``model`` a request names (its responses
            carry that name) instead of answering 404 for another name.
    """
    engine = engine or build_engine(model.transformer, model.tokenizer.eos_ids)
    runner = Runner(engine)
    limits = limits or Limits()
    if limits.max_seq_len is None:  # the engine's positions per sequence bound every request
        limits = replace(limits, max_seq_len=getattr(engine, "max_seq_len", None))
    name = model_id or str(model.path).rsplit("/", 1)[-1]
    created = int(time.time())
    fingerprint = system_fingerprint(model)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runner.start()
        yield
        runner.stop()  # what is still running is cancelled; the engine thread ends

    app = FastAPI(title="clearlm", docs_url=None, redoc_url=None, lifespan=lifespan)

    def openapi() -> dict[str, Any]:  # built on first request, then kept (FastAPI's own habit)
        if app.openapi_schema is None:
            served = None if any_model else name
            vocab = model.config.vocab_size
            app.openapi_schema = openapi_schema(app, bool(api_key), served, vocab, limits)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.state.runner = runner
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return APIError(exc.status_code, str(exc.detail), code=code).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]  # FastAPI's own checks (path parameters): as parse() words them
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or None  # after "path"
        msg, code = first.get("msg", "invalid request"), error_code(first.get("type", ""))
        return APIError(400, f"{where or 'request'}: {msg}", where, code).response()

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        msg = f"internal error: {type(exc).__name__}"
        return APIError(500, msg, type="server_error").response()

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "clearlm"}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": name, "requests": runner.live()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_name:path}")
    async def one_model(model_name: str) -> dict[str, Any]:
        if model_name != name:
            raise APIError(404, f"model {model_name!r} is not served here", code="model_not_found")
        return model_card()

    async def generate(request: Request, kind: str) -> Response:
        raw = await read_body(request, max_body)
        if kind == "completion":
            body: Any = parse(raw, CompletionBody)
        else:
            body = parse(raw, ChatBody)
        if body.model != name and not any_model:  # OpenAI's answer: 404, model_not_found
            raise APIError(404, f"unknown model {body.model!r}; this server serves {name!r}",
                           "model", "model_not_found")  # fmt: skip
        shown = body.model  # the name the client sent (with any_model, whatever it is)
        prepare = completion_job if kind == "completion" else chat_job
        job = await asyncio.to_thread(prepare, model, body, limits)  # tokenizing: off the loop
        if job.score_prompts:  # echo + logprobs: one forward pass per prompt, between steps
            k = job.top_logprobs
            job.scored = await asyncio.to_thread(
                runner.exclusive, lambda: [score_prompt(model, p, k) for p in job.prompts]
            )
        key = None if inspect is None else request_key(request, bearer_token)
        keep = None if inspect is None or key is None else recorder(inspect, key)
        session = Session(runner, job, model.tokenizer, kind, fingerprint, keep)
        await session.start()
        if inspect is not None and key is not None:  # 409 for its id until close() keeps it
            inspect.begin(session.id, key)
        if job.stream:
            return SessionStream(session, shown)
        try:
            async for _ in session.events(request.is_disconnected):
                pass
        finally:
            session.close()
        if session.running():  # the client went away: nobody reads this
            return Response(status_code=499)
        return JSONResponse(session.final(shown))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat")

    add_inspect_route(app, model, runner, inspect, name, bearer_token)
    return app
