"""The OpenAPI 3.1 description the server publishes at ``GET /openapi.json``.

The routes read their bodies themselves (:func:`clearlm.serve.schemas.parse`), so FastAPI alone
would describe them with no request body at all. This module adds what a client or a fuzzer
needs: each POST route's body as the JSON schema of its pydantic model
(:class:`~clearlm.serve.schemas.CompletionBody`, :class:`~clearlm.serve.schemas.ChatBody`, the
very models that check requests), the two media types a generation answers with
(``application/json``, or ``text/event-stream`` with ``stream: true``), and every refusal the
server can give, in OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``):
400 for bad input, 401 when the server has an API key, 404 for an unknown model (and for
``GET /v1/inspect/{completion_id}``, inspection off or an id not kept; 409 there for a
completion still being generated). FastAPI's 422
is dropped: the server never answers it (its validation errors are 400s).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from clearlm.serve.inspect_api import PATH as INSPECT_PATH
from clearlm.serve.requests import Limits
from clearlm.serve.schemas import ChatBody, CompletionBody
from clearlm.serve.settings import PENALTY_RANGE

REF = "#/components/schemas/{model}"
BODIES = {"/v1/completions": CompletionBody, "/v1/chat/completions": ChatBody}

ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

REASONS = {
    400: "Bad input: the body is not UTF-8 JSON, a field is unknown, missing, mistyped or out "
    "of range, or the prompt does not fit the context",
    401: "Missing or wrong API key",
    404: "Unknown route or model; for /v1/inspect, inspection off or no such completion kept "
    "for this API key",
    405: "Method not allowed",
    409: "The completion is still being generated (its stream is open); ask again after",
}


# The ranges the server checks (SamplingParams' RULES, clearlm.serve.settings'
# PENALTY_RANGE), stated in the
# description so that a client, or a fuzzer, can tell a good value from a bad one.
RANGES: dict[str, dict[str, Any]] = {
    "temperature": {"minimum": 0},
    "top_k": {"minimum": 0},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
    "min_p": {"minimum": 0, "maximum": 1},
    "repetition_penalty": {"minimum": PENALTY_RANGE[0], "maximum": PENALTY_RANGE[1]},
    "presence_penalty": {"minimum": -2, "maximum": 2},
    "frequency_penalty": {"minimum": -2, "maximum": 2},
    "seed": {"minimum": -1, "exclusiveMaximum": 2**63},  # -1: random
}
# Content may be null (or left out) only in an assistant message that has tool_calls.
CALLS_ONLY = {
    "if": {"required": ["role", "tool_calls"],
           "properties": {"role": {"const": "assistant"},
                          "tool_calls": {"type": "array", "minItems": 1}}},
    "else": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
}  # fmt: skip


def narrow(prop: dict[str, Any], kind: str, **rules: Any) -> None:
    """Add ``rules`` to the ``kind`` branches of a property's ``anyOf`` (or to it)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == kind:
            branch.update(rules)


def describe_values(schemas: dict[str, Any], vocab: int, max_n: int, max_prompts: int) -> None:
    """State in the bodies' schemas the checks pydantic's types do not show: the sampling
    ranges, ``n`` at most ``max_n``, non-empty stop strings, ``logit_bias`` keys as token ids
    and biases in [-100, 100], prompts non-empty (token ids in [0, vocab), at most
    ``max_prompts`` of them) and content null only beside an assistant's tool calls."""
    for body in BODIES.values():
        props = schemas[body.__name__]["properties"]
        for name, rules in RANGES.items():
            narrow(props[name], "integer" if name in ("top_k", "seed") else "number", **rules)
        narrow(props["n"], "integer", maximum=max_n)
        narrow(props["stop"], "string", minLength=1)
        narrow(props["stop"], "array", items={"type": "string", "minLength": 1})
        narrow(props["logit_bias"], "object", propertyNames={"pattern": "^[0-9]+$"},
               additionalProperties={"type": "number", "minimum": -100, "maximum": 100})
    ids = {"type": "array", "minItems": 1,
           "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}  # fmt: skip
    schemas["CompletionBody"]["properties"]["prompt"]["anyOf"] = [
        {"type": "string", "minLength": 1},
        ids,
        {"type": "array", "minItems": 1, "maxItems": max_prompts,
         "items": {"type": "string", "minLength": 1}},
        {"type": "array", "minItems": 1, "maxItems": max_prompts, "items": ids},
    ]  # fmt: skip
    message = schemas["Message"]
    message["required"] = ["role"]
    message.update(CALLS_ONLY)


def error_response(status: int) -> dict[str, Any]:
    schema = {"$ref": REF.format(model="Error")}
    return {"description": REASONS[status], "content": {"application/json": {"schema": schema}}}


def openapi_schema(
    app: FastAPI, with_key: bool, served: str | None, vocab: int, limits: Limits
) -> dict[str, Any]:
    """The description of ``app``'s routes, bodies and answers (a JSON-ready dict).

    Args:
        app: the server's FastAPI app (routes from :func:`clearlm.serve.app.create_app`).
        with_key: the server requires an API key (every route may answer 401).
        served: the one ``model`` name the server answers to (the bodies' ``model`` is that
            name), or None when it serves any name (``--any-model``).
        vocab: the model's vocabulary size (token ids in prompts are below it).
        limits: the per-request limits (``n``, prompts per request).
    """
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    refs, defs = models_json_schema(
        [(model, "validation") for model in BODIES.values()], ref_template=REF
    )
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):  # FastAPI's 422, never sent
        components.pop(unused, None)
    components.update(defs.get("$defs", {}))
    components["Error"] = ERROR
    describe_values(components, vocab, limits.max_n, limits.max_prompts)
    if served is not None:  # another name is a 404 (model_not_found), as OpenAI answers
        for model in BODIES.values():
            components[model.__name__]["properties"]["model"] = {"type": "string", "enum": [served]}
    if with_key:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            answers = op.setdefault("responses", {})
            answers.pop("422", None)
            statuses = [401] if with_key else []
            model = BODIES.get(path)
            if model is not None and method == "post":
                op["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": refs[(model, "validation")]}},
                }
                answers["200"] = {
                    "description": "The completion, or server-sent events with stream: true",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        # one server-sent event (3.1: the schema describes each event):
                        # its data, a JSON chunk or the closing "[DONE]"
                        "text/event-stream": {"schema": {
                            "type": "object", "required": ["data"],
                            "properties": {"data": {"type": "string"}}}},  # fmt: skip
                    },
                }
                statuses += [400, 404]
            elif path == INSPECT_PATH:  # out of range; off or unknown; still generating
                statuses += [400, 404, 409]
            elif "{" in path:  # a path parameter: /v1/models/{model_name}
                statuses.append(404)
                for param in op.get("parameters", []) if served is not None else []:
                    param["schema"]["examples"] = [served]
            for status in sorted(statuses):
                answers[str(status)] = error_response(status)
    return doc
