"""What real OpenAI clients send and expect, through the official ``openai`` client: the
closing chunk of a stream, ``system_fingerprint``, text parts, ``seed: -1``, ``--any-model``."""

from __future__ import annotations

import openai
import pytest
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.serve import create_app

MODEL = "tiny"
MSGS = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    path = write_tiny_llama(tmp_path_factory.mktemp("c") / "t.gguf", context_length=256)
    return clearlm.load(path)


@pytest.fixture(scope="module")
def client(tiny):
    with serving(create_app(tiny, model_id=MODEL)) as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("max_tokens", [6, 40])  # ends by length, or (likely) by an end token
def test_chat_stream_closes_each_choice_with_its_own_empty_chunk(client, tiny, max_tokens):
    ask = dict(model=MODEL, messages=MSGS, max_tokens=max_tokens, temperature=0.9, seed=4, n=2)
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True))
    fps = {c.system_fingerprint for c in chunks} | {whole.system_fingerprint}
    assert len(fps) == 1 and fps.pop().startswith("fp_")
    for i, want in enumerate(whole.choices):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert mine[0].delta.role == "assistant"
        assert "".join(c.delta.content or "" for c in mine) == want.message.content
        last = mine[-1]  # the closing chunk: no text, no logprobs, only the reason
        assert last.finish_reason == want.finish_reason and last.delta.content is None
        assert last.logprobs is None and {c.finish_reason for c in mine[:-1]} == {None}
        assert any(c.delta.content for c in mine[:-1])  # the text came before, not with it


def test_completion_stream_closes_with_empty_text(client, tiny):
    ask = dict(model=MODEL, prompt="hello", max_tokens=5, temperature=0)
    whole = client.completions.create(**ask)
    chunks = list(client.completions.create(**ask, stream=True, logprobs=1))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].text == "" and chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices[0].logprobs is None
    assert {c.choices[0].finish_reason for c in chunks[:-1]} == {None}
    tokens = [t for c in chunks[:-1] for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == whole.usage.completion_tokens == 5
    assert whole.system_fingerprint == chunks[0].system_fingerprint


def test_text_parts_are_joined_with_a_newline(client, tiny):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the best book"}]
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=8, temperature=0
    )
    joined = [{"role": "user", "content": "What is\nthe best book"}]
    assert r.usage.prompt_tokens == len(tiny.chat_prompt(joined))
    assert r.choices[0].message.content == tiny.chat(joined, max_new_tokens=8, temperature=0).text


def test_seed_minus_one_is_random_and_the_largest_seed_is_taken(client, tiny):
    ask = dict(model=MODEL, prompt="Once", max_tokens=12, temperature=1.0)
    texts = {client.completions.create(**ask, seed=-1).choices[0].text for _ in range(4)}
    assert len(texts) > 1  # four random seeds: the tiny model's 12 tokens differ
    top = 2**63 - 1
    r = client.completions.create(**ask, seed=top, n=2)
    want = [tiny.generate("Once", max_new_tokens=12, temperature=1.0, seed=top + i) for i in (0, 1)]
    assert [c.text for c in r.choices] == [w.text for w in want]


def test_any_model_serves_whatever_name_is_sent(tiny):
    with serving(create_app(tiny, model_id=MODEL, any_model=True)) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        r = c.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=4, temperature=0)
        assert r.model == "gpt-4o"
        assert r.choices[0].message.content == tiny.chat(MSGS, max_new_tokens=4, temperature=0).text
        assert [m.id for m in c.models.list().data] == [MODEL]
