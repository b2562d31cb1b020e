"""Prompt logprobs and lists of prompts on /v1/completions, through the official ``openai``
client: ``echo`` + ``logprobs`` (OpenAI's shape, the first token's logprob null), ``max_tokens:
0`` (the prompt scored alone, as lm-evaluation-harness's ``local-completions`` asks for
loglikelihood), a list of prompts with choice ``i * n + j``, and the one rule for 0 tokens
across the API, the CLI and the server."""

from __future__ import annotations

import json
import subprocess
import sys

import openai
import pytest
import torch
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine.serial import SerialEngine
from clearlm.serve import create_app

MODEL = "tiny"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("p") / "t.gguf", context_length=256)


@pytest.fixture(scope="module")
def tiny(tiny_path) -> clearlm.Model:
    return clearlm.load(tiny_path)


@pytest.fixture(scope="module")
def client(tiny):
    with serving(create_app(tiny, model_id=MODEL)) as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


def prompt_lp(model: clearlm.Model, ids: list[int]) -> torch.Tensor:
    """(T - 1, V): log-softmax of the raw logits; row t scores token t + 1."""
    return torch.log_softmax(model.logits(ids)[:-1].double(), dim=-1)


def test_echo_with_logprobs_scores_the_prompt(client, tiny, monkeypatch):
    monkeypatch.setattr("clearlm.serve.logprobs.ROWS", 3)  # several blocks of positions
    text = "hello world, once"
    ids = tiny.encode(text)
    r = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=2)
    (c,) = r.choices
    assert c.text == text and c.finish_reason == "length" and r.usage.completion_tokens == 0
    lp, want = c.logprobs, prompt_lp(tiny, ids)
    assert lp.tokens == [tiny.tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    got = lp.token_logprobs[1:]
    assert got == pytest.approx([float(want[t - 1, ids[t]]) for t in range(1, len(ids))], abs=1e-5)
    for t in range(1, len(ids)):
        top = torch.topk(want[t - 1], 2).indices.tolist()
        assert set(lp.top_logprobs[t]) == {tiny.tokenizer.decode([i]) for i in [*top, ids[t]]}
    assert lp.text_offset == [sum(len(p) for p in lp.tokens[:i]) for i in range(len(ids))]


def test_echo_with_logprobs_and_tokens_to_generate(client, tiny):
    ask = dict(model=MODEL, prompt="abc def", echo=True, logprobs=1, temperature=0.8, seed=5)
    r = client.completions.create(**ask, max_tokens=4)
    want = tiny.generate("abc def", max_new_tokens=4, temperature=0.8, seed=5)
    lp, n = r.choices[0].logprobs, len(tiny.encode("abc def"))
    assert r.choices[0].text == "abc def" + want.text
    assert len(lp.tokens) == n + 4 and lp.token_logprobs[n:] == pytest.approx(want.logprobs)
    assert lp.text_offset[n] == len("abc def")
    chunks = list(client.completions.create(**ask, max_tokens=4, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == lp.tokens  # the echo chunk carries the prompt's logprobs
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


@pytest.mark.parametrize("as_ids", [False, True])
def test_a_list_of_prompts_gives_choice_i_times_n_plus_j(client, tiny, as_ids):
    texts = ["Once", "The cat", "hello"]
    prompts = [tiny.encode(t) for t in texts] if as_ids else texts
    r = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=5, temperature=1,
                                  seed=7)  # fmt: skip
    assert [c.index for c in r.choices] == list(range(6))
    for c in r.choices:
        i, j = divmod(c.index, 2)
        want = tiny.generate(prompts[i], max_new_tokens=5, temperature=1, seed=7 + j)
        assert c.text == want.text
    assert r.usage.prompt_tokens == sum(len(tiny.encode(t)) for t in texts)
    assert r.usage.completion_tokens == 6 * 5 or r.choices[0].finish_reason == "stop"


def test_lm_eval_loglikelihood_request(client, tiny):
    """local-completions' shape: token-id prompts, echo, max_tokens 0, logprobs 1, greedy."""
    context, cont = tiny.encode("The cat"), tiny.encode(" sat down")
    seqs = [context + cont, context + cont[:1]]
    r = client.completions.create(model=MODEL, prompt=seqs, max_tokens=0, echo=True, logprobs=1,
                                  temperature=0, seed=1234)  # fmt: skip
    for c, ids in zip(r.choices, seqs, strict=True):
        want = prompt_lp(tiny, ids)
        got = sum(c.logprobs.token_logprobs[len(context):])
        assert got == pytest.approx(sum(float(want[t - 1, ids[t]]) for t in
                                        range(len(context), len(ids))), abs=1e-4)  # fmt: skip


def test_zero_tokens_is_one_rule(client, tiny, tiny_path):
    r = client.completions.create(model=MODEL, prompt="hi", max_tokens=0)
    assert (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens) == (
        "", "length", 0)  # fmt: skip
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=0
    )
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("", "length")
    chunks = list(client.completions.create(model=MODEL, prompt="hi", max_tokens=0, stream=True))
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks] == [("", "length")]
    api = tiny.generate("hi", max_new_tokens=0)
    assert (api.text, api.tokens, api.finish_reason) == ("", [], "length")
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "generate", "hi", "--model", str(tiny_path), "-n", "0",
         "--json", "--quiet"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["text"], out["token_ids"], out["finish_reason"]) == ("", [], "length")


def test_prompt_logprobs_equal_transformers(smollm2, hf_smollm2_model):
    """The real model scored through the server equals transformers on the same file."""
    engine = SerialEngine(smollm2.transformer, smollm2.tokenizer.eos_ids)
    ids = smollm2.encode("The capital of France is Paris.")
    with serving(create_app(smollm2, engine, model_id="m")) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        r = c.completions.create(model="m", prompt=ids, max_tokens=0, echo=True, logprobs=0)
    with torch.no_grad():
        ref = hf_smollm2_model(torch.tensor([ids])).logits[0].double().log_softmax(-1)  # (T, V)
    want = [float(ref[t - 1, ids[t]]) for t in range(1, len(ids))]
    assert r.choices[0].logprobs.token_logprobs[1:] == pytest.approx(want, abs=2e-3)


def test_zero_tokens_takes_a_prompt_that_fills_the_context(tiny, client):
    ids = [5] * tiny.config.context_length  # no room for a token: fine when none is asked for
    assert tiny.generate(ids, max_new_tokens=0).finish_reason == "length"
    assert [r.finish_reason for r in tiny.generate([ids, ids], max_new_tokens=0)] == ["length"] * 2
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    assert len(r.choices[0].logprobs.tokens) == len(ids)
    with pytest.raises(clearlm.errors.ContextLengthError, match="no room for a new token"):
        tiny.generate(ids, max_new_tokens=1)
