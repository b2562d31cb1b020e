"""``clearlm serve`` through the official ``openai`` client: every answer equals the same
request run alone through clearlm's Python API (same settings, same seed)."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.sampling.chain import SamplingParams, filter_logits, log_softmax
from clearlm.serve import create_app

MODEL = "tiny"
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    path = write_tiny_llama(tmp_path_factory.mktemp("s") / "t.gguf", context_length=256)
    return clearlm.load(path)


@pytest.fixture(scope="module")
def client(tiny):
    with serving(create_app(tiny, model_id=MODEL)) as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def test_models(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize("settings", [
    dict(temperature=0.9, top_p=0.9, seed=5),
    dict(temperature=0.0, presence_penalty=1.5, frequency_penalty=0.5),
    dict(temperature=1.3, seed=2, extra_body=dict(top_k=20, min_p=0.05, repetition_penalty=1.2)),
])  # fmt: skip
def test_completion_equals_the_api(client, tiny, settings):
    r = client.completions.create(model=MODEL, prompt="hello world", max_tokens=20, **settings)
    flat = {k: v for k, v in settings.items() if k != "extra_body"} | settings.get("extra_body", {})
    want = tiny.generate("hello world", max_new_tokens=20, **flat)
    (c,) = r.choices
    assert c.text == want.text
    assert c.finish_reason == ("length" if want.finish_reason == "length" else "stop")
    n_prompt = len(tiny.encode("hello world"))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, len(want.tokens))
    assert r.usage.total_tokens == n_prompt + len(want.tokens)


def test_penalties_change_the_output(client):
    plain = client.completions.create(model=MODEL, prompt="ab", max_tokens=30, temperature=0)
    fp = client.completions.create(
        model=MODEL, prompt="ab", max_tokens=30, temperature=0, frequency_penalty=2
    )
    assert plain.choices[0].text != fp.choices[0].text


def test_chat_equals_the_api_and_streams_the_same_text(client, tiny):
    r = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=25, temperature=0.8, seed=3
    )
    want = tiny.chat(MSGS, max_new_tokens=25, temperature=0.8, seed=3)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(tiny.chat_prompt(MSGS))
    assert r.usage.completion_tokens == len(want.tokens)
    stream = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=25, temperature=0.8, seed=3, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == r.choices[0].finish_reason and set(finals[:-1]) == {None}
    assert chunks[-1].usage.completion_tokens == len(want.tokens) and not chunks[-1].choices


def test_stream_ends_with_done(client, tiny):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 4, "stream": True, "seed": 1}
    with httpx.stream("POST", f"{client.base_url}completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)


def test_stop_strings_cut_the_text(client, tiny):
    full = tiny.generate("The", max_new_tokens=60, temperature=0).text
    i = next(i for i in range(5, len(full) - 1) if full[i : i + 2].isascii() and
             full[i : i + 2].isprintable())  # fmt: skip
    stop = full[i : i + 2]
    for given in (stop, ["\u0000never", stop]):
        r = client.completions.create(
            model=MODEL, prompt="The", max_tokens=60, temperature=0, stop=given
        )
        assert r.choices[0].text == full[: full.index(stop)]
        assert r.choices[0].finish_reason == "stop"
        want = tiny.generate("The", max_new_tokens=60, temperature=0, stop=given)
        assert r.usage.completion_tokens == len(want.tokens)


def test_seed_reproducible_and_n_choices_use_seed_plus_i(client, tiny):
    ask = dict(model=MODEL, prompt="Once", max_tokens=12, temperature=1.0)
    a = client.completions.create(**ask, seed=42).choices[0].text
    assert client.completions.create(**ask, seed=42).choices[0].text == a
    assert client.completions.create(**ask, seed=43).choices[0].text != a
    r = client.completions.create(**ask, seed=42, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    runs = [
        tiny.generate("Once", max_new_tokens=12, temperature=1.0, seed=42 + i) for i in range(3)
    ]
    assert [c.text for c in r.choices] == [w.text for w in runs]
    assert r.usage.completion_tokens == sum(len(w.tokens) for w in runs)


def test_completion_logprobs_and_echo(client, tiny):
    r = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=8, temperature=0.7, seed=9, logprobs=2
    )
    want = tiny.generate("abc", max_new_tokens=8, temperature=0.7, seed=9)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(want.logprobs, abs=1e-6)
    assert lp.tokens == [tiny.tokenizer.decode([t]) for t in want.tokens]
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=8, temperature=0, echo=True)
    assert r.choices[0].text == "abc" + tiny.generate("abc", max_new_tokens=8, temperature=0).text


def test_chat_top_logprobs_equal_an_independent_computation(client, tiny):
    r = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=5, temperature=0.7, seed=1, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    want = tiny.chat(MSGS, max_new_tokens=5, temperature=0.7, seed=1)
    assert [e.logprob for e in content] == pytest.approx(want.logprobs, abs=1e-6)
    assert [bytes(e.bytes) for e in content] == [tiny.tokenizer.token_bytes(t) for t in want.tokens]
    # the first position's alternatives: the sampling distribution of the prompt's last logits
    ids = tiny.chat_prompt(MSGS)
    chat = SamplingParams(0.7, top_k=40, top_p=0.9, repetition_penalty=1.1)  # chat's defaults
    filtered = filter_logits(tiny.logits(ids)[-1], torch.tensor(ids), chat)
    top = torch.topk(log_softmax(filtered), 3)
    got = content[0].top_logprobs
    assert [bytes(e.bytes) for e in got] == [tiny.tokenizer.token_bytes(i) for i in top.indices]
    assert [e.logprob for e in got] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_the_app_runs_without_its_lifespan_events(tiny):
    """fastapi's TestClient outside a ``with`` sends no startup event: the runner starts on
    the first request instead of leaving it waiting."""
    from fastapi.testclient import TestClient

    client = TestClient(create_app(tiny, model_id=MODEL))
    r = client.post(
        "/v1/completions", json=dict(model=MODEL, prompt="hi", max_tokens=3, temperature=0)
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
