"""OpenAI's ``logit_bias`` as a step of the sampling chain: added to the logits before every
other step; +100 forces a token and -100 bans one, with the real default model, through the
Python API and through the server (the official ``openai`` client)."""

from __future__ import annotations

import math

import openai
import pytest
import torch
from serve_helpers import serving

from clearlm.engine.serial import SerialEngine
from clearlm.errors import SamplingParamsError
from clearlm.sampling.chain import SamplingParams, filter_logits, sampling_chain
from clearlm.sampling.filters import logit_bias
from clearlm.serve import create_app

PROMPT = "The capital of France is"


def test_the_bias_is_added_to_the_named_logits_only():
    z = torch.tensor([[0.0, 1.0, -math.inf, 2.0], [5.0, 5.0, 5.0, 5.0]], dtype=torch.float16)
    out = logit_bias(z, {1: -3.0, 2: 100.0, 3: 0.5})
    want = torch.tensor([[0.0, -2.0, -math.inf, 2.5], [5.0, 2.0, 105.0, 5.5]])
    assert out.dtype == torch.float32 and torch.equal(out, want)
    assert torch.equal(logit_bias(z, {}), z.float())


def test_the_bias_runs_first_and_greedy_keeps_it():
    p = SamplingParams(temperature=0.5, top_k=1, logit_bias={2: 100.0})
    assert [s.name for s in sampling_chain(p, None)][:2] == ["logit_bias", "repetition_penalty"]
    z = torch.tensor([3.0, 2.0, 1.0])  # top-k 1 after the bias keeps the biased token
    assert torch.isfinite(filter_logits(z, None, p)).tolist() == [False, False, True]
    greedy = SamplingParams(temperature=0, logit_bias={2: 100.0})
    assert [s.name for s in sampling_chain(greedy, None)] == ["logit_bias", "repetition_penalty"]
    assert "logit_bias" not in [s.name for s in sampling_chain(SamplingParams(), None)]


@pytest.mark.parametrize(("bias", "needle"), [
    ({5: 101}, "logit_bias[5] must be a number in [-100, 100], got 101"),
    ({5: float("nan")}, "logit_bias[5] must be a number in [-100, 100]"),
    ({-1: 1.0}, "logit_bias key -1 is not a token id"),
    ({"5": 1.0}, "logit_bias key '5' is not a token id"),
    ({True: 1.0}, "logit_bias key True is not a token id"),
    ([1, 2], "logit_bias must be None or a dict"),
])  # fmt: skip
def test_bad_biases_are_refused_naming_the_entry(bias, needle):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(logit_bias=bias)
    assert needle in str(e.value)


def test_plus_100_forces_and_minus_100_bans_with_the_real_model(smollm2):
    plain = smollm2.generate(PROMPT, max_new_tokens=3, temperature=0)
    forced_id = smollm2.encode(" banana")[0]
    assert forced_id not in plain.tokens
    for t in (0, 0.8):
        forced = smollm2.generate(
            PROMPT, max_new_tokens=3, temperature=t, seed=1, logit_bias={forced_id: 100}
        )
        assert forced.tokens == [forced_id] * 3
    first = plain.tokens[0]
    banned = smollm2.generate(PROMPT, max_new_tokens=3, temperature=0, logit_bias={first: -100})
    logits = smollm2.logits(PROMPT)[-1]  # (V,): the runner-up is the new greedy choice
    assert banned.tokens[0] == int(torch.topk(logits, 2).indices[1]) != first
    with pytest.raises(SamplingParamsError, match=r"logit_bias key 49152 is not a token id"):
        smollm2.generate(PROMPT, max_new_tokens=1, logit_bias={49152: 1.0})


def test_the_server_takes_logit_bias_on_both_endpoints(smollm2):
    engine = SerialEngine(smollm2.transformer, smollm2.tokenizer.eos_ids)  # a small cache
    forced_id = smollm2.encode(" banana")[0]
    with serving(create_app(smollm2, engine, model_id="m")) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        r = c.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0,
                                 logit_bias={str(forced_id): 100})  # fmt: skip
        assert r.choices[0].text == smollm2.tokenizer.decode([forced_id] * 3)
        msgs = [{"role": "user", "content": "Name a fruit."}]
        plain = smollm2.chat(msgs, max_new_tokens=4, temperature=0)
        bias = {plain.tokens[0]: -100.0}
        want = smollm2.chat(msgs, max_new_tokens=4, temperature=0, logit_bias=bias)
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0,
                                      logit_bias={str(k): v for k, v in bias.items()})  # fmt: skip
        assert r.choices[0].message.content == want.text != plain.text
