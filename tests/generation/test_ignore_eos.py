"""``ignore_eos`` (llama-server's and vLLM's): the end token does not end generation, so a run
makes exactly ``max_new_tokens`` tokens; in the Python API (one prompt, a batch, a stream), the
server (the official ``openai`` client) and ``clearlm generate --ignore-eos``."""

from __future__ import annotations

import json

import openai
import pytest
from cli_in_process import run_clearlm
from serve_helpers import serving

from clearlm.engine.serial import SerialEngine
from clearlm.serve import create_app

# SmolLM2 answers this greedily in 12 tokens, then its end token <|im_end|> (id 2)
PROMPT = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\n"
N = 20


@pytest.fixture(scope="module")
def plain(smollm2):
    r = smollm2.generate(PROMPT, max_new_tokens=N, temperature=0)
    assert r.finish_reason == "eos" and len(r.tokens) < N  # the premise: it ends by itself
    return r


def test_the_api_goes_on_past_the_end_token(smollm2, plain):
    r = smollm2.generate(PROMPT, max_new_tokens=N, temperature=0, ignore_eos=True)
    assert len(r.tokens) == N and r.finish_reason == "length"
    assert r.tokens[: len(plain.tokens)] == plain.tokens  # the end token is kept, in place
    assert r.text.startswith(plain.text)
    rows = smollm2.generate([PROMPT, PROMPT], max_new_tokens=[N, 5], temperature=0,
                            ignore_eos=True)  # fmt: skip
    assert [x.tokens for x in rows] == [r.tokens, r.tokens[:5]]
    chunks = list(smollm2.stream(PROMPT, max_new_tokens=N, temperature=0, ignore_eos=True))
    assert [c.token for c in chunks if c.token is not None] == r.tokens


def test_the_server_takes_ignore_eos(smollm2, plain):
    engine = SerialEngine(smollm2.transformer, smollm2.tokenizer.eos_ids)  # a small cache
    with serving(create_app(smollm2, engine, model_id="m")) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        ask = dict(model="m", prompt=PROMPT, max_tokens=N, temperature=0)
        r = c.completions.create(**ask)
        assert r.usage.completion_tokens == len(plain.tokens)
        assert r.choices[0].finish_reason == "stop"
        r = c.completions.create(**ask, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == N and r.choices[0].finish_reason == "length"
        want = smollm2.generate(PROMPT, max_new_tokens=N, temperature=0, ignore_eos=True)
        assert r.choices[0].text == want.text


def test_the_cli_option(smollm2_path, plain):
    def run(*extra: str) -> dict:
        proc = run_clearlm("generate", PROMPT, "--model", str(smollm2_path), "-n", str(N),
                           "--temperature", "0", "--json", "--quiet", *extra,
                           text=True)  # clearlm.cli.main, in this process  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    assert run()["token_ids"] == plain.tokens
    out = run("--ignore-eos")
    assert len(out["token_ids"]) == N and out["finish_reason"] == "length"
