"""Logprobs through the official ``openai`` client: ``top_logprobs: N`` lists N alternatives
even where top-k / top-p / min-p removed candidates (those at -9999.0, in the model's order),
and the completions' ``top_logprobs`` carry the sampled token (``logprobs: 0`` included)."""

from __future__ import annotations

import openai
import pytest
import torch
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine.serial import SerialEngine
from clearlm.sampling.chain import SamplingParams, filter_logits, log_softmax
from clearlm.sampling.defaults import chat_defaults
from clearlm.serve import create_app

MODEL = "tiny"
MSGS = [{"role": "user", "content": "Hi there"}]
FLOOR = -9999.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    path = write_tiny_llama(tmp_path_factory.mktemp("l") / "t.gguf", context_length=256)
    return clearlm.load(path)


@pytest.fixture(scope="module", params=["batch", "serial"])
def client(tiny, request):
    engine = SerialEngine(tiny.transformer, tiny.tokenizer.eos_ids)
    app = create_app(tiny, engine if request.param == "serial" else None, model_id=MODEL)
    with serving(app) as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def expected_top(tiny: clearlm.Model, ids: list[int], params: SamplingParams, k: int):
    """The first position's alternatives, computed here: kept tokens by their sampling
    logprob, then removed ones by the raw logits, at -inf."""
    logits = tiny.logits(ids)[-1]  # (V,)
    lp = log_softmax(filter_logits(logits, torch.tensor(ids), params))  # (V,)
    kept = sorted((i for i in range(len(lp)) if lp[i] > float("-inf")), key=lambda i: -lp[i])
    gone = sorted((i for i in range(len(lp)) if lp[i] == float("-inf")), key=lambda i: -logits[i])
    return [(i, float(lp[i]) if lp[i] > float("-inf") else FLOOR) for i in (kept + gone)[:k]]


@pytest.mark.parametrize("settings", [dict(top_k=2), dict(min_p=0.9), dict(top_p=0.05)])
def test_chat_top_logprobs_are_always_n(client, tiny, settings):
    r = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=6, temperature=0.7, seed=2, logprobs=True,
        top_logprobs=5, extra_body=settings,
    )  # fmt: skip
    content = r.choices[0].logprobs.content
    assert [len(e.top_logprobs) for e in content] == [5] * len(content)
    assert all(any(a.logprob == FLOOR for a in e.top_logprobs) for e in content)
    given = dict(temperature=0.7, **settings)  # the rest: chat's defaults, as the server fills
    params = tiny.sampling_params(None, chat_defaults(tiny.generation_defaults, given), **given)
    want = expected_top(tiny, tiny.chat_prompt(MSGS), params, 5)
    got = content[0].top_logprobs
    assert [bytes(a.bytes) for a in got] == [tiny.tokenizer.token_bytes(i) for i, _ in want]
    assert [a.logprob for a in got] == pytest.approx([v for _, v in want], abs=1e-5)


def test_completion_top_logprobs_hold_the_sampled_token(client, tiny):
    ask = dict(model=MODEL, prompt="abc", max_tokens=6, temperature=0.9, seed=3)
    r = client.completions.create(**ask, logprobs=0)
    lp = r.choices[0].logprobs
    assert [list(t.items()) for t in lp.top_logprobs] == [
        [(tok, v)] for tok, v in zip(lp.tokens, lp.token_logprobs, strict=True)
    ]
    want = tiny.generate("abc", max_new_tokens=6, temperature=0.9, seed=3)
    assert lp.token_logprobs == pytest.approx(want.logprobs, abs=1e-6)
    r = client.completions.create(**ask, logprobs=3, extra_body=dict(top_k=2))
    lp = r.choices[0].logprobs
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[tok] == v and 1 <= len(top) <= 4  # pieces that decode alike share a key
