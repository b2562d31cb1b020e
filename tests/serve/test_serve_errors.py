"""Bad input never takes ``clearlm serve`` down: each kind of bad request gets OpenAI's error
shape with the right status and field, and the next good request is answered. Also: the API
key, and a client that walks away mid-stream freeing its slot at once."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from serve_helpers import SlowEngine, free_port, serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine.scheduler import BatchEngine
from clearlm.engine.serial import SerialEngine
from clearlm.serve import create_app
from clearlm.serve.server import GracefulServer

MODEL = "tiny"
CTX = 128
GOOD = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    return clearlm.load(
        write_tiny_llama(tmp_path_factory.mktemp("e") / "t.gguf", context_length=CTX),
    )


@pytest.fixture(scope="module")
def url(tiny):
    with serving(create_app(tiny, model_id=MODEL, max_body=4096)) as u:
        yield u


def post(url: str, path: str, content: bytes | None = None, **kw) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{url}/{path}", content=content, headers=headers, timeout=30, **kw)


def check_error(r: httpx.Response, status: int, param: str | None, needle: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and needle in err["message"], err
    assert err["type"] == "invalid_request_error"


def with_(base: dict, **changes) -> bytes:
    return json.dumps({**base, **changes}).encode()


CASES = [  # (path, body, param, code, a piece of the message)
    ("completions", b'{"model": "tiny", "prompt": ', None, "invalid_json", "not valid JSON"),
    ("completions", b"[1, 2]", None, "invalid_type", "must be a JSON object, got an array"),
    ("chat/completions", b"null", None, "invalid_type", "must be a JSON object, got null"),
    ("completions", b'{"prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}", None, "invalid_json",
     "nested too deeply"),
    ("completions", b'{"model": "tiny", "prompt": "\xff\xfe"}', None, "invalid_utf8",
     "not valid UTF-8"),
    ("completions", with_(GOOD, prompt="x" * 5000), None, "request_too_large",
     "over the server's limit of 4096"),
    ("completions", b'{"prompt": "hi"}', "model", "missing_required_parameter",
     "model: Field required"),
    ("chat/completions", b'{"model": "tiny"}', "messages", "missing_required_parameter",
     "messages: Field required"),
    ("chat/completions", with_(CHAT, messages=[{"role": "user"}]), "messages.0.content",
     "missing_required_parameter", "Field required"),
    ("completions", with_(GOOD, temprature=0.5), "temprature", "unknown_parameter",
     "unknown field; see docs/serving.md (Routes and request fields) for the supported ones"),
    ("chat/completions", with_(CHAT, messages=[{"role": "user", "content": "x", "rol": "y"}]),
     "messages.0.rol", "unknown_parameter", "unknown field"),
    ("completions", with_(GOOD, temperature="hot"), "temperature", "invalid_type", "valid number"),
    ("completions", with_(GOOD, stream="yes"), "stream", "invalid_type", "valid boolean"),
    ("completions", with_(GOOD, max_tokens=1.5), "max_tokens", "invalid_type", "valid integer"),
    ("completions", with_(GOOD, model=5), "model", "invalid_type", "valid string"),
    ("completions", with_(GOOD, prompt={"text": "hi"}), "prompt", "invalid_type", "valid"),
    ("completions", with_(GOOD, temperature=-1), "temperature", "invalid_value",
     "temperature must be in [0, inf)"),
    ("completions", with_(GOOD, top_p=1.5), "top_p", "invalid_value", "top_p must be in (0, 1]"),
    ("completions", with_(GOOD, presence_penalty=3), "presence_penalty", "invalid_value",
     "[-2, 2]"),
    # found by schemathesis (test_serve_fuzz.py): 5e-324 overflowed mid-generation, a 500 that
    # failed every request in the batch; the server's range keeps float32 logits in float64
    ("completions", with_(GOOD, repetition_penalty=5e-324), "repetition_penalty",
     "invalid_value", "repetition_penalty must be in [1e-100, 1e100] (1 means off), got 5e-324"),
    ("chat/completions", with_(CHAT, repetition_penalty=1e300), "repetition_penalty",
     "invalid_value", "repetition_penalty must be in [1e-100, 1e100]"),
    ("completions", with_(GOOD, repetition_penalty=0), "repetition_penalty", "invalid_value",
     "got 0"),
    ("completions", with_(GOOD, seed=-2), "seed", "invalid_value",
     "seed must be -1 (random) or in [0, 2**63), got -2"),
    ("completions", with_(GOOD, seed=2**63), "seed", "invalid_value",
     f"seed must be -1 (random) or in [0, 2**63), got {2**63}"),
    ("chat/completions", with_(CHAT, stream_options={"include_usage": True}), "stream_options",
     "invalid_value", "stream_options is only allowed with stream: true"),
    ("completions", with_(GOOD, logprobs=21), "logprobs", "invalid_value",
     "less than or equal to 20"),
    ("completions", with_(GOOD, max_tokens=-1), "max_tokens", "invalid_value",
     "greater than or equal to 0"),
    ("completions", with_(GOOD, n=9), "n", "invalid_value", "n must be at most 8"),
    ("completions", with_(GOOD, max_tokens=10**6), "max_tokens", "invalid_value",
     "context length is 128"),
    ("completions", with_(GOOD, prompt="a" * 200), "prompt", "context_length_exceeded",
     "the prompt has 200 tokens"),
    ("completions", with_(GOOD, prompt="a" * CTX), "prompt", "context_length_exceeded",
     "no room for a new token"),
    ("completions", with_(GOOD, prompt=[5, 10**6]), "prompt", "invalid_value",
     "outside the vocabulary"),
    ("completions", with_(GOOD, prompt=[]), "prompt", "invalid_value", "the prompt is empty"),
    ("completions", with_(GOOD, prompt=["a", ""]), "prompt.1", "invalid_value",
     "the prompt is empty"),
    ("completions", with_(GOOD, prompt=[[1, 2], [3, 10**6]]), "prompt.1", "invalid_value",
     "outside the vocabulary"),
    ("completions", with_(GOOD, prompt=["a", [3]]), "prompt", "invalid_type", "valid"),
    ("completions", with_(GOOD, prompt=["a"] * 65), "prompt", "invalid_value",
     "a request takes at most 64 prompts, got 65"),
    ("completions", with_(GOOD, stop=["ok", ""]), "stop", "invalid_value", "must not be empty"),
    ("completions", with_(GOOD, logit_bias={"5": 101}), "logit_bias.5", "invalid_value",
     "logit_bias[5] must be in [-100, 100], got 101"),
    ("chat/completions", with_(CHAT, logit_bias={"5": -100, "x": 1}), "logit_bias.x",
     "invalid_value", "logit_bias key 'x' is not a token id of this model"),
    ("completions", with_(GOOD, logit_bias={"100000": 1}), "logit_bias.100000",
     "invalid_value", "give ids in [0, "),
    ("completions", with_(GOOD, logit_bias={"-1": 1}), "logit_bias.-1", "invalid_value",
     "is not a token id"),
    ("completions", with_(GOOD, logit_bias={"5": "big"}), "logit_bias.5", "invalid_type",
     "valid number"),
    ("completions", with_(GOOD, ignore_eos="yes"), "ignore_eos", "invalid_type",
     "valid boolean"),
    ("chat/completions", with_(CHAT, messages=[]), "messages", "invalid_value", "at least 1 item"),
    ("chat/completions", with_(CHAT, messages={"role": "user"}), "messages", "invalid_type",
     "valid list"),
    ("chat/completions", with_(CHAT, messages=[{"role": "robot", "content": "x"}]),
     "messages.0.role", "invalid_value", "'system', 'developer', 'user', 'assistant' or 'tool'"),
    ("chat/completions", with_(CHAT, messages=[{"role": "user", "content": None}]), "messages.0",
     "invalid_value", "only an assistant message with tool_calls may leave it out"),
    ("chat/completions", with_(CHAT, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]),
     "messages.0", "invalid_value", "of type 'image_url': the models clearlm runs take text only"),
    ("chat/completions", with_(CHAT, tools=[{"type": "function", "function": {"name": "f"}}]),
     "tools", "unsupported", "this model's chat template does not render tools"),
    ("chat/completions", with_(CHAT, tool_choice="required"), "tool_choice", "invalid_value",
     "tool_choice forces a call, but the request has no tools"),
    ("chat/completions", with_(CHAT, tool_choice={"type": "function", "function": {"name": "f"}}),
     "tool_choice", "invalid_value", "tool_choice forces a call, but the request has no tools"),
    ("chat/completions", with_(CHAT, tool_choice={"type": "function"}), "tool_choice",
     "invalid_value", 'tool_choice must be "none", "auto", "required" or'),
    ("chat/completions", with_(CHAT, tools=[{"type": "function", "function": {"name": ""}}]),
     "tools.0.function.name", "invalid_value", "at least 1 character"),
    ("chat/completions", with_(CHAT, top_logprobs=2), "top_logprobs", "invalid_value",
     "needs logprobs: true"),
    # max_completion_tokens: the errors name the field the client sent, not max_tokens
    ("chat/completions", with_(CHAT, max_tokens=None, max_completion_tokens=10**6),
     "max_completion_tokens",
     "invalid_value", "max_completion_tokens is 1000000 but the model's context length is 128"),
    ("chat/completions", with_(CHAT, max_tokens=None, max_completion_tokens=-1),
     "max_completion_tokens", "invalid_value", "greater than or equal to 0"),
    ("chat/completions", with_(CHAT, max_completion_tokens=4), "max_completion_tokens",
     "invalid_value", "max_tokens (3) and max_completion_tokens (4) differ; send one"),
    # prompt + max_tokens past the context: OpenAI's 400, with the numbers (not a cut text)
    ("completions", with_(GOOD, prompt=[5] * 60, max_tokens=100), "prompt",
     "context_length_exceeded", "the model's context length is 128 tokens, but this request "
     "asks for 160 (60 in the prompt, 100 for the completion, max_tokens)"),
    ("chat/completions", with_(CHAT, max_tokens=None, max_completion_tokens=127), "messages",
     "context_length_exceeded", "for the completion, max_completion_tokens); shorten the prompt "
     "or lower max_completion_tokens"),
    # several fields wrong: the first is the one reported, the others are named after it
    ("chat/completions", b'{"messages": [], "max_tokens": -1}', "model",
     "missing_required_parameter", "model: Field required (also invalid: max_tokens, messages)"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param", "code", "needle"), CASES)
def test_bad_input_is_a_400_and_the_next_request_is_answered(url, path, body, param, code, needle):
    """Each refusal names its field in ``param`` and its reason in ``code`` (never null: schema
    errors had ``code: null``), with OpenAI's codes where OpenAI has one."""
    r = post(url, path, body)
    check_error(r, 400, param, needle)
    assert r.json()["error"]["code"] == code
    good = post(url, path, json.dumps(CHAT if path.startswith("chat") else GOOD).encode())
    assert good.status_code == 200 and good.json()["choices"][0]["finish_reason"] == "length"


def test_max_tokens_and_max_completion_tokens_may_agree(url):
    r = post(url, "chat/completions", with_(CHAT, max_tokens=2, max_completion_tokens=2))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("path", ["completions", "chat/completions"])
def test_an_unknown_model_is_a_404_model_not_found_as_openai(url, path):
    """OpenAI answers a request for a model it does not serve with 404, invalid_request_error,
    code model_not_found (it was a 400 here)."""
    r = post(url, path, with_(CHAT if path.startswith("chat") else GOOD, model="gpt-4"))
    check_error(r, 404, "model", "unknown model 'gpt-4'; this server serves 'tiny'")
    assert r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(f"{url}/models/gpt-4")  # the same answer as /v1/models/{id}
    check_error(r, 404, None, "model 'gpt-4' is not served here")
    assert r.json()["error"]["code"] == "model_not_found"


def test_unknown_routes_and_methods_have_the_error_shape(url):
    r = httpx.get(f"{url}/nope")
    check_error(r, 404, None, "Not Found")
    assert r.json()["error"]["code"] == "not_found"
    r = httpx.get(f"{url}/completions")
    check_error(r, 405, None, "Method Not Allowed")
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(url.removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_the_official_client_raises_its_typed_errors(url, tiny):
    c = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown model 'nope'"):
        c.completions.create(model="nope", prompt="hi")
    long = [{"role": "user", "content": "a" * 300}]
    n = len(tiny.chat_prompt(long))
    with pytest.raises(openai.BadRequestError, match=f"the prompt has {n} tokens"):
        c.chat.completions.create(model=MODEL, messages=long)
    r = c.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=0)
    assert r.choices[0].text == tiny.generate("hi", max_new_tokens=2, temperature=0).text


def test_null_means_unset(url):
    nulls = dict(n=None, stream=None, echo=None, logprobs=None, stop=None, seed=None, user=None,
                 logit_bias=None, stream_options=None, temperature=None)  # fmt: skip
    r = post(url, "completions", with_(GOOD, **nulls))
    assert r.status_code == 200 and len(r.json()["choices"]) == 1
    r = post(url, "chat/completions", with_(CHAT, logprobs=None, top_logprobs=None, n=None))
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None


def test_lone_surrogates_become_replacement_characters(url, tiny):
    r = post(url, "completions", b'{"model": "tiny", "prompt": "a\\ud800", "max_tokens": 2}')
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == len(tiny.encode("a\ufffd"))


def test_api_key_is_required_on_every_route(tiny):
    with serving(create_app(tiny, model_id=MODEL, api_key="s3cret")) as u:
        root = u.removesuffix("/v1")
        for r in (httpx.get(f"{u}/models"), httpx.get(f"{root}/health"),
                  post(u, "completions", json.dumps(GOOD).encode()),
                  httpx.get(f"{u}/models", headers={"Authorization": "Bearer wrong"})):  # fmt: skip
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=u, api_key="wrong", max_retries=0).models.list()
        c = openai.OpenAI(base_url=u, api_key="s3cret", max_retries=0)
        assert c.completions.create(model=MODEL, prompt="hi", max_tokens=2).usage.completion_tokens
        ok = httpx.get(f"{root}/health", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_the_auth_scheme_is_case_insensitive(tiny):
    """RFC 7235 section 2.1: the scheme is case-insensitive and is followed by one or more
    spaces; "bearer KEY" was refused. The key itself is compared exactly."""
    with serving(create_app(tiny, model_id=MODEL, api_key="s3cret")) as u:
        for given, status in [("bearer s3cret", 200), ("BEARER s3cret", 200),
                              ("Bearer  s3cret", 200), ("Bearer s3cret", 200),
                              ("bearer S3CRET", 401), ("bearer s3cre", 401),
                              ("Basic s3cret", 401), ("Bearers3cret", 401), ("s3cret", 401),
                              ("bearer", 401), ("", 401)]:  # fmt: skip
            r = httpx.get(f"{u}/models", headers={"Authorization": given})
            assert r.status_code == status, given
        assert status == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_a_client_that_disconnects_frees_its_slot_at_once(tiny):
    """A 0.02 s/step engine: the long request (100 tokens) would hold it for 2 s more."""
    engine = SlowEngine(tiny.transformer, tiny.tokenizer.eos_ids, delay_s=0.02)
    app = create_app(tiny, engine, model_id=MODEL)
    with serving(app) as u:
        body = {**GOOD, "max_tokens": 100, "stream": True}
        with httpx.stream("POST", f"{u}/completions", json=body, timeout=30) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 4:
                    break  # leave mid-stream: closing the response closes the connection
        t0 = time.monotonic()
        while engine.has_work() or app.state.runner.live():
            assert time.monotonic() - t0 < 1.0, "the aborted request still holds the engine"
            time.sleep(0.01)
        t1 = time.monotonic()
        r = post(u, "completions", json.dumps(GOOD).encode())  # 3 tokens, ~0.06 s
        assert r.status_code == 200 and time.monotonic() - t1 < 1.5
        assert len(engine.added) == 2


def test_a_prompt_past_the_engines_max_seq_len_names_the_prompt(tiny):
    """An engine holding 32 positions per sequence (below the context, 128) refuses a longer
    prompt: a 400 naming the prompt (or the messages), and the next request is answered. A
    prompt that fits with a max_tokens that does not is refused too (OpenAI's 400
    context_length_exceeded, docs/serving.md), streaming or not, on both endpoints; without
    max_tokens the generation runs up to the 32 positions and ends with "length"."""
    engine = BatchEngine(tiny.transformer, tiny.tokenizer.eos_ids, max_seq_len=32)
    with serving(create_app(tiny, engine, model_id=MODEL)) as u:
        long = with_(GOOD, prompt=[5] * 40)
        check_error(post(u, "completions", long), 400, "prompt", "--max-seq-len is 32")
        msgs = [[{"role": "user", "content": "hi " * k}] for k in range(1, 60)]
        past = next(m for m in msgs if 32 < len(tiny.chat_prompt(m)) < CTX)  # fits the context
        chat = with_(CHAT, messages=past)
        check_error(post(u, "chat/completions", chat), 400, "messages", "--max-seq-len is 32")
        big = with_(GOOD, max_tokens=40)  # fits the context (128), not the engine's 32
        check_error(post(u, "completions", big), 400, "max_tokens", "--max-seq-len is 32")
        for stream in (False, True):
            near = with_(GOOD, prompt=[5] * 28, max_tokens=30, stream=stream)  # 58 > 32
            r = post(u, "completions", near)
            says = "request asks for 58 (28 in the prompt, 30 for the completion, max_tokens)"
            check_error(
                r, 400, "prompt", f"the server's --max-seq-len is 32 tokens, but this {says}"
            )
            assert r.json()["error"]["code"] == "context_length_exceeded"
            n_chat = len(tiny.chat_prompt(CHAT["messages"]))
            r = post(u, "chat/completions", with_(CHAT, max_tokens=33 - n_chat, stream=stream))
            check_error(r, 400, "messages", f"asks for 33 ({n_chat} in the messages")
            assert r.json()["error"]["code"] == "context_length_exceeded"
        fits = post(u, "completions", with_(GOOD, prompt=[5] * 28, max_tokens=4)).json()
        assert fits["usage"]["completion_tokens"] == 4  # exactly the room left: 32 − 28
        unset = {k: v for k, v in GOOD.items() if k != "max_tokens"}  # default 16, room 4
        near = post(u, "completions", with_(unset, prompt=[5] * 28)).json()
        assert near["usage"]["completion_tokens"] == 4  # up to the context, said as "length"
        assert near["choices"][0]["finish_reason"] == "length"
        chat = {k: v for k, v in CHAT.items() if k != "max_tokens"}
        reply = post(u, "chat/completions", json.dumps(chat).encode()).json()
        assert reply["choices"][0]["finish_reason"] == "length"  # the tiny model ends no text
        assert reply["usage"]["total_tokens"] == 32
        with pytest.raises(openai.BadRequestError) as caught:  # the official client's view
            openai.OpenAI(base_url=u, api_key="x").completions.create(
                model=MODEL, prompt=[5] * 28, max_tokens=30, stream=True)  # fmt: skip
        assert caught.value.code == "context_length_exceeded"
        assert post(u, "completions", with_(GOOD)).status_code == 200


class BrokenEngine(SerialEngine):
    def step(self):
        raise RuntimeError("boom")


def test_an_engine_failure_is_a_500_and_the_server_stays_up(tiny):
    with serving(create_app(tiny, BrokenEngine(tiny.transformer, []), model_id=MODEL)) as u:
        r = post(u, "completions", json.dumps(GOOD).encode())
        assert r.status_code == 500
        assert (
            r.json()["error"]["type"] == "server_error" and "boom" in r.json()["error"]["message"]
        )
        body = {**GOOD, "stream": True}
        with httpx.stream("POST", f"{u}/completions", json=body, timeout=30) as s:
            lines = [ln for ln in s.iter_lines() if ln]
        assert "boom" in json.loads(lines[-1].removeprefix("data: "))["error"]["message"]
        assert httpx.get(u.removesuffix("/v1") + "/health").status_code == 200


def test_shutdown_cancels_what_outlives_the_grace_period(tiny):
    """A 100-token stream at 0.02 s a step (2 s) and a 1 s grace period: cut, cleanly."""
    engine = SlowEngine(tiny.transformer, [], delay_s=0.02)
    app = create_app(tiny, engine, model_id=MODEL)
    lines: list[str] = []

    def read(url: str) -> None:
        body = {**GOOD, "max_tokens": 100, "stream": True}
        try:
            with httpx.stream("POST", f"{url}/completions", json=body, timeout=30) as r:
                lines.extend(ln for ln in r.iter_lines() if ln)
        except httpx.TransportError:  # the server closed the connection mid-stream
            lines.append("(closed)")

    with serving(app, grace_s=1) as u:
        reader = threading.Thread(target=read, args=(u,))
        reader.start()
        while not lines:
            time.sleep(0.01)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 1.0 + 2.0  # the grace period, not the 2 s of the stream
    reader.join(10)
    assert "data: [DONE]" not in lines and len(lines) < 100
    assert not engine.has_work() and not app.state.runner.thread.is_alive()


def test_sigterm_answers_what_outlives_the_grace_period_with_503(tiny):
    """`clearlm serve`'s server (GracefulServer) on SIGTERM: requests still running when the
    grace period ends get OpenAI's 503 shutting_down (a stream: an error event), not a bare 500
    or a cut connection (uvicorn's own cancellation comes 2 s later)."""
    engine = SlowEngine(tiny.transformer, [], delay_s=0.02)
    app = create_app(tiny, engine, model_id=MODEL)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=1 + 2)  # fmt: skip
    server = GracefulServer(config, app.state.runner.stop, grace_s=1)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    url, got = f"http://127.0.0.1:{port}/v1/completions", {}

    def stream() -> None:
        with httpx.stream("POST", url, json={**GOOD, "max_tokens": 100, "stream": True},
                          timeout=30) as r:  # fmt: skip
            got["stream"] = [ln for ln in r.iter_lines() if ln]

    def whole() -> None:
        got["whole"] = httpx.post(url, json={**GOOD, "max_tokens": 100}, timeout=30)

    readers = [threading.Thread(target=f) for f in (stream, whole)]
    for r in readers:
        r.start()
    deadline = time.monotonic() + 30
    while len(engine.added) < 2:  # both queued in the engine (100 tokens: 2 s each)
        assert time.monotonic() < deadline and all(r.is_alive() for r in readers), got
        time.sleep(0.02)
    server.handle_exit(signal.SIGTERM, None)
    for r in readers:
        r.join(20)
    thread.join(20)
    assert got["whole"].status_code == 503
    assert got["whole"].json()["error"]["code"] == "shutting_down"
    assert "data: [DONE]" not in got["stream"]
    assert any("shutting_down" in ln for ln in got["stream"])
