"""Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, architecture qwen2) against transformers loading
the same file in float32. `make test` pulls the file; the 1.5B model is opt-in (`make
test-large`)."""

from __future__ import annotations

import pytest
from real_parity import (
    TOL,
    greedy_matches_or_near_tie,
    hf_gguf_model,
    hf_gguf_model_and_tokenizer,
    last_logit_diff,
)

import clearlm
from clearlm.errors import ModelNotFoundError
from clearlm.store.catalog import resolve_model

PROMPTS = {
    "short": "The capital of France is",
    "cjk": "人工智能是计算机科学的一个分支，它",
    "code": "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot =",
    "chat": "<|im_start|>user\nWrite a Python function that adds two numbers.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "digits_emoji": "I have 3 cats 🐱 and 12 dogs 🐶. Together that makes",
}


def _load(alias: str, with_tokenizer: bool = False):
    """Ours (float32) and transformers' model on the file. with_tokenizer: transformers'
    tokenizer is built too, on the same parse of the file (the session's one, which
    tests/tokenizer/test_tokenizer.py compares against; parsing the file again takes ~10 s)."""
    try:
        path = resolve_model(alias)
    except ModelNotFoundError as e:
        pytest.skip(f"{alias} not available ({e})")
    ref = hf_gguf_model_and_tokenizer(path)[0] if with_tokenizer else hf_gguf_model(path)
    return clearlm.load(path, weights="float32"), ref


@pytest.fixture(scope="module")
def qwen05():
    return _load("qwen2.5-coder-0.5b-instruct", with_tokenizer=True)


@pytest.fixture(scope="module")
def qwen15():
    return _load("qwen2.5-coder-1.5b-instruct")


def _check_logits(pair, alice_text):
    ours, ref = pair
    prompts = {**PROMPTS, "paragraph": alice_text}
    for name, text in prompts.items():
        ids = ours.encode(text)
        last, every = last_logit_diff(ours.transformer, ref, ids)
        print(f"\n{name}: T={len(ids)} max|Δlogit| last={last:.2e} all={every:.2e}")
        assert last <= TOL and every <= TOL


# Greedy decoding (the KV cache path) on two of the prompts, 24 tokens each: the logits test
# above already covers every prompt at every position; transformers' generate costs ~6 s a
# prompt here.
GREEDY = ("code", "cjk")


def _check_greedy(pair):
    ours, ref = pair
    for name in GREEDY:
        ids = ours.encode(PROMPTS[name])
        got = ours.generate(ids, max_new_tokens=24, temperature=0).tokens
        at, gap = greedy_matches_or_near_tie(got, ref, ids, ours.tokenizer.eos_id)
        if at is not None:
            print(f"\n{name}: diverged at step {at}; reference top-2 gap {gap:.2e} (near-tie)")
            assert gap <= 1e-3, f"{name}: diverged at step {at} without a near-tie ({gap})"


def test_qwen05_config(qwen05):
    c = qwen05[0].config
    assert (c.architecture, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads) == (
        "qwen2",
        24,
        896,
        14,
        2,
    )
    assert c.attn_bias and not c.attn_out_bias and c.rope_theta == 1e6


def test_qwen05_logits_match_transformers(qwen05, alice_text):
    _check_logits(qwen05, alice_text)


def test_qwen05_greedy_matches_transformers(qwen05):
    _check_greedy(qwen05)


@pytest.mark.large
def test_qwen15_logits_match_transformers(qwen15, alice_text):
    _check_logits(qwen15, alice_text)


@pytest.mark.large
def test_qwen15_greedy_matches_transformers(qwen15):
    _check_greedy(qwen15)
