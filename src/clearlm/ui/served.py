"""``clearlm ui --server URL``: the page for completions a ``clearlm serve --inspect`` answered.

No model is loaded here: the page asks this app, which asks the server's ``GET
/v1/inspect/{id}`` (with the API key given to ``clearlm ui``, so the key never reaches the
browser, and no cross-origin request is needed), and draws what comes back: each generated
token with its probability, the alternatives at the chosen token, the logit lens at that
token (the local page's lens table) and the lens over the whole answer (layers × tokens).

Endpoints: ``GET /`` (the page, ``static/served.html``), ``GET /api/info`` (the server's
address), ``GET /api/served/{id}?choice=&top=&layers=`` (the server's answer as is). A
refusal of the server comes back with its status as ``{"error": message}`` (what the local
page reads); a server that cannot be reached is a 502 saying so.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from importlib.resources import files
from typing import Annotated, Any

from fastapi import FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

TIMEOUT_S = 600  # a long answer's lens on a CPU takes a while; the server computes it once


def server_base(url: str) -> str:
    """``http://host:port`` from what a user may give: with or without ``/v1`` or a slash.

    Raises ValueError for a URL that is not http(s)://host[:port][/v1]."""
    base = url.strip().rstrip("/").removesuffix("/v1")
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
        raise ValueError(f"--server wants the serve address, like http://127.0.0.1:8000, got "
                         f"{url!r}")
    return base


def fetch_inspection(
    base: str, completion_id: str, query: dict[str, Any], api_key: str | None
) -> tuple[int, dict[str, Any]]:
    """``GET {base}/v1/inspect/{completion_id}?query``: (status, JSON body); a refusal's body
    becomes ``{"error": message}``, an unreachable server (502, the reason)."""
    path = urllib.parse.quote(completion_id, safe="")
    args = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
    req = urllib.request.Request(f"{base}/v1/inspect/{path}?{args}")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:  # noqa: S310 (http(s) only)
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"the server answered HTTP {e.code}"
        return e.code, {"error": message}
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        return 502, {"error": f"cannot reach the server at {base}: {reason}"}


def create_served_app(server: str, api_key: str | None = None) -> FastAPI:
    """The page and its one proxy route for the ``clearlm serve`` at ``server``.

    Args:
        server: the serve address (``http://127.0.0.1:8000``, ``/v1`` accepted).
        api_key: sent as ``Authorization: Bearer`` (a server shows a completion only to
            the key that made it).

    Raises:
        ValueError: ``server`` is not an http(s) address.
    """
    base = server_base(server)
    app = FastAPI(title="clearlm ui", docs_url=None, redoc_url=None, openapi_url=None)
    page = files("clearlm.ui").joinpath("static/served.html").read_bytes().decode("utf-8")

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Any, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or "request"
        return JSONResponse({"error": f"{where}: {first.get('msg')}"}, status_code=422)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        return {"server": base}

    @app.get("/api/served/{completion_id}")
    def served(
        completion_id: str,
        choice: Annotated[int, Query(ge=0)] = 0,
        top: Annotated[int, Query(ge=1)] = 5,
        layers: str | None = None,
    ) -> JSONResponse:
        query = {"choice": choice, "top": top, "layers": layers}
        status, body = fetch_inspection(base, completion_id, query, api_key)
        return JSONResponse(body, status_code=status)

    return app
