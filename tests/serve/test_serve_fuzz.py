"""Property-based fuzzing of every endpoint of ``clearlm serve`` from the OpenAPI description it
publishes (``GET /openapi.json``), with schemathesis against a live server on a tiny model.

Bounded: at most ``EXAMPLES`` examples per operation and phase, ``MAX_TIME_S`` seconds in all,
each request given ``REQUEST_TIMEOUT_S`` (a request that takes longer is a hang, and fails the
run). Deterministic generation, so a failure reproduces. The checks: no 5xx
(``not_a_server_error``), every status documented (``status_code_conformance``: no 422, 413,
500, ...), content types and bodies as documented (every 4xx body is OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}``, which the description states with
``additionalProperties: false``), and bodies that break the schema refused
(``negative_data_rejection``). Also checked here: what the description says of the bodies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.serve import create_app
from clearlm.serve.inspect_store import InspectStore

pytest.importorskip("schemathesis")

MODEL = "tiny"
EXAMPLES = 30
MAX_TIME_S = 30
REQUEST_TIMEOUT_S = 10
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance,negative_data_rejection")  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("f") / "t.gguf",
                                         context_length=128))  # fmt: skip


@pytest.fixture(scope="module")
def url(tiny):
    # --inspect on: every fuzzed completion is also recorded, and /v1/inspect is fuzzed
    with serving(create_app(tiny, model_id=MODEL, inspect=InspectStore())) as u:
        yield u.removesuffix("/v1")


def test_openapi_describes_the_bodies(url):
    doc = httpx.get(f"{url}/openapi.json", timeout=30).json()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatBody"}
    schemas = doc["components"]["schemas"]
    assert schemas["ChatBody"]["required"] == ["model", "messages"]
    assert schemas["ChatBody"]["additionalProperties"] is False  # unknown fields are refused
    assert schemas["CompletionBody"]["properties"]["model"] == {"type": "string", "enum": [MODEL]}
    assert set(chat["responses"]) == {"200", "400", "404"}
    temperature = schemas["ChatBody"]["properties"]["temperature"]["anyOf"]
    assert {"type": "number", "minimum": 0} in temperature  # the ranges the server checks
    message = schemas["Message"]  # content null only beside an assistant's tool calls
    assert message["required"] == ["role"] and message["else"]["required"] == ["content"]
    assert schemas["Error"]["properties"]["error"]["required"] == ["message", "type", "param",
                                                                   "code"]  # fmt: skip


def test_schemathesis_finds_no_server_error(url, tmp_path):
    cli = Path(sys.executable).with_name("schemathesis")
    cmd = [str(cli), "run", f"{url}/openapi.json", "--max-examples", str(EXAMPLES),
           "--max-time", str(MAX_TIME_S), "--request-timeout", str(REQUEST_TIMEOUT_S),
           "--phases", "examples,coverage,fuzzing", "--mode", "all", "--checks", CHECKS,
           "--generation-deterministic", "--no-color"]  # fmt: skip
    env = {**os.environ, "SCHEMATHESIS_HOOKS": ""}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=MAX_TIME_S + 60)  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    assert "passed" in out and "0 operations" not in out, out[-3000:]
    good = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=good, timeout=30)  # and it is still serving
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
