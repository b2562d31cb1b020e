"""The web app behind ``clearlm ui``: one static page and a small JSON API over one model.

Endpoints (all POST a JSON body holding the prompt, so any request can be replayed alone):

- ``/api/analyze``   tokens, logit lens, next-token distribution (and layer/head counts)
- ``/api/attention`` one layer/head's attention pattern
- ``/api/sampling``  what temperature / top-k / top-p / min-p keep (explain_sampling)
- ``/api/sample``    draw one token and return the prompt with it appended
- ``/api/patch``     the activation-patching grid of a clean/corrupted pair (Model.patch)
- ``/api/diff``      a second model (``--diff B``) against this one on a text (clearlm.diff;
  :mod:`clearlm.ui.diff`); 400 when the page was started without one

The server computes, the page renders. A prompt is run once and kept in a small LRU cache, so
moving a slider only reruns the sampling chain on the cached last logits. Every error is JSON
``{"error": message}`` with a 4xx status. Model calls are serialised with a lock: tracing
records into the model's shared hook registry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from importlib.resources import files
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from clearlm.api.model import Model
from clearlm.errors import ClearLMError
from clearlm.inspect import analysis
from clearlm.inspect.analysis import Analysis
from clearlm.inspect.diff import DEFAULT_THRESHOLD
from clearlm.sampling.chain import SamplingParams
from clearlm.text import clean_text
from clearlm.ui.diff import diff_json

CACHE_SIZE = 8


class PromptIn(BaseModel):
    """A request about one prompt."""

    # strict: "layer": "1" or true is an error, not 1 (a JSON int still fills a float field)
    model_config = ConfigDict(extra="forbid", strict=True)
    # a JSON "\ud800" escape arrives as a lone surrogate: it becomes U+FFFD, as in the API
    prompt: Annotated[str, AfterValidator(clean_text)]


class AttentionIn(PromptIn):
    """Which head's pattern to return."""

    layer: int = 0
    head: int = 0


class SamplingIn(PromptIn):
    """The sliders: SamplingParams' fields (validated there, with its messages)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = 0
    top: int = Field(default=analysis.TOP, ge=1, le=100)

    def params(self) -> SamplingParams:
        """The settings as SamplingParams (raises SamplingParamsError with a clear message)."""
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
        )


class PatchIn(BaseModel):
    """A clean/corrupted pair to patch, the two answers and the hook points (comma-separated
    kinds or names, as ``clearlm patch --points``)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    clean: Annotated[str, AfterValidator(clean_text)]
    corrupted: Annotated[str, AfterValidator(clean_text)]
    answer: Annotated[str, AfterValidator(clean_text)]
    wrong: Annotated[str, AfterValidator(clean_text)]
    points: str = "resid_pre"


class DiffIn(BaseModel):
    """A text for both models, and the relative error of the residual stream over which a
    block counts as the first that drifted."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: Annotated[str, AfterValidator(clean_text)]
    threshold: float = Field(default=DEFAULT_THRESHOLD, ge=0.0, allow_inf_nan=False)


def _validation_message(exc: RequestValidationError) -> str:
    """Pydantic's error list as one line: ``top_k: Input should be a valid integer``."""
    parts = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "request"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def create_app(
    model: Model,
    title: str | None = None,
    diff: Model | None = None,
    diff_title: str | None = None,
) -> FastAPI:
    """A FastAPI app serving the page and the JSON API for ``model``.

    Args:
        model: a loaded :class:`~clearlm.api.model.Model`.
        title: shown in the page header; default the model file's name.
        diff: a second Model for the Diff panel (``clearlm ui --diff B``), compared with
            ``model`` as the reference; None: /api/diff answers 400 saying how to start one.
            The caller checks the pair first (:func:`clearlm.ui.diff.check_pair`).
        diff_title: its name on the page; default its file's name.
    """
    app = FastAPI(title="clearlm ui", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()
    cache: OrderedDict[str, Analysis] = OrderedDict()
    name = title or str(model.path).rsplit("/", 1)[-1]
    diff_name = None if diff is None else diff_title or str(diff.path).rsplit("/", 1)[-1]
    page = files("clearlm.ui").joinpath("static/index.html").read_bytes().decode("utf-8")

    def run(prompt: str) -> Analysis:
        """The prompt's analysis, from the cache or computed now (under the lock)."""
        with lock:
            if prompt in cache:
                cache.move_to_end(prompt)
                return cache[prompt]
            a = analysis.analyze(model, prompt)
            cache[prompt] = a
            if len(cache) > CACHE_SIZE:
                cache.popitem(last=False)
            return a

    @app.exception_handler(ClearLMError)
    async def clearlm_error(_: Request, exc: ClearLMError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # e.g. a body that is not JSON at all: starlette says "There was an error parsing the
        # body" as {"detail": ...}; the page reads {"error": ...}
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": _validation_message(exc)}, status_code=422)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        c = model.config
        return {
            "model": name,
            "n_layers": c.n_layers,
            "n_heads": c.n_heads,
            "vocab_size": c.vocab_size,
            "max_prompt_tokens": min(analysis.MAX_PROMPT_TOKENS, c.context_length - 1),
            "diff": diff_name,  # the second model's name, or None (no --diff)
        }

    @app.post("/api/analyze")
    def analyze(body: PromptIn) -> dict[str, Any]:
        return analysis.summary(model, run(body.prompt))

    @app.post("/api/attention")
    def attention(body: AttentionIn) -> dict[str, Any]:
        return analysis.attention(run(body.prompt), body.layer, body.head)

    @app.post("/api/sampling")
    def sampling(body: SamplingIn) -> dict[str, Any]:
        params = body.params()  # validate before running the prompt
        a = run(body.prompt)
        with lock:
            return analysis.sampling(model, a, params, body.top)

    @app.post("/api/sample")
    def sample(body: SamplingIn) -> dict[str, Any]:
        params = body.params()
        a = run(body.prompt)
        with lock:
            return analysis.sample(model, a, body.prompt, params)

    @app.post("/api/patch")
    def patch(body: PatchIn) -> dict[str, Any]:
        with lock:  # the patched runs hook the model's shared registry
            return analysis.patching(
                model, body.clean, body.corrupted, body.answer, body.wrong, body.points
            )

    @app.post("/api/diff")
    def model_diff(body: DiffIn) -> dict[str, Any]:
        with lock:  # both models' passes record into their hook registries
            out = diff_json(model, diff, body.text, body.threshold)
        return {"model_a": name, "model_b": diff_name, **out}

    return app
