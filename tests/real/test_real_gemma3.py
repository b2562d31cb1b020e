"""Gemma 3 270M (base, Q4_K_M GGUF, architecture gemma3) against transformers loading the same
file in float32: last-position logits for six prompts, one of them longer than the 512-token
sliding window, and 24-token greedy continuations with the KV cache on two of them.

Token ids come from transformers' tokenizer reading the same GGUF, so these checks do not depend
on clearlm's SentencePiece tokenizer. The file comes from `clearlm pull gemma3-270m` (`make test`
runs it); without it the tests skip. Loading takes a while (transformers' model ≈ 40 s, its
tokenizer ≈ 10 s more on the same parse of the file), so everything is built once per session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from real_parity import (
    TOL,
    greedy_matches_or_near_tie,
    hf_gguf_model_and_tokenizer,
    last_logit_diff,
)

from clearlm.errors import ModelNotFoundError
from clearlm.generation.loop import decode_step, new_cache, prefill
from clearlm.loading.checkpoint import load_gguf_model
from clearlm.loading.load import LoadedModel
from clearlm.store.catalog import resolve_model

EOS = 1  # <eos> in Gemma 3's vocabulary (tokenizer.ggml.eos_token_id)
PROMPTS = {
    "short": "The capital of France is",
    "cjk": "人工智能是计算机科学的一个分支，它",
    "code": "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot =",
    "digits_emoji": "I have 3 cats 🐱 and 12 dogs 🐶. Together that makes",
    "multilingual": "Der schnelle braune Fuchs springt über den faulen Hund, et puis il",
}


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    try:
        return resolve_model("gemma3-270m")
    except ModelNotFoundError as e:
        pytest.skip(f"Gemma 3 270M GGUF not available; run `clearlm pull gemma3-270m` ({e})")


@pytest.fixture(scope="session")
def gemma3_ours(gemma3_path: Path) -> LoadedModel:
    return load_gguf_model(gemma3_path)


@pytest.fixture(scope="session")
def gemma3_reference(gemma3_path: Path):
    """transformers' model and tokenizer on the same GGUF (every tensor dequantized to float32),
    on one parse of the file; the tokenizer is the session's one (real_parity.hf_gguf_tokenizer,
    which tests/tokenizer/test_tokenizer_sp.py uses too), built once."""
    return hf_gguf_model_and_tokenizer(gemma3_path)


def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens (fewer if <eos> comes) from prefill + decode_step with the KV cache."""
    cache = new_cache(model, 1, len(ids) + n)
    logits = prefill(model, torch.tensor([ids]), cache)  # (1, V)
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits[0].argmax()))
        if out[-1] == EOS or len(out) == n:
            break
        logits = decode_step(model, torch.tensor([[out[-1]]]), cache)
    return out


def test_config(gemma3_ours):
    c = gemma3_ours.config
    assert (c.architecture, c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim) == (
        "gemma3",
        18,
        640,
        4,
        1,
        256,
    )
    assert c.layer_types == (("sliding",) * 5 + ("full",)) * 3 and c.sliding_window == 512
    assert (c.rope_theta, c.rope_local_theta) == (1e6, 1e4) and c.qk_norm
    assert c.block == "sandwich" and c.norm_offset == 1.0 and c.embed_scale == 640**0.5


def test_logits_match_transformers(gemma3_ours, gemma3_reference, alice_text):
    ref, tokenizer = gemma3_reference
    worst = 0.0
    for name, text in {**PROMPTS, "paragraph": alice_text}.items():
        ids = tokenizer(text)["input_ids"]  # <bos> first (add_bos_token)
        last, every = last_logit_diff(gemma3_ours.model, ref, ids)
        print(f"\n{name}: T={len(ids)} max|Δlogit| last={last:.2e} all positions={every:.2e}")
        assert last <= TOL and every <= TOL
        worst = max(worst, every)
        if name == "paragraph":
            assert len(ids) > 512  # past the sliding window
    print(f"\nworst max|Δlogit| = {worst:.2e}")


def test_greedy_matches_transformers(gemma3_ours, gemma3_reference):
    ref, tokenizer = gemma3_reference
    for name in ("code", "multilingual"):  # the logits test covers every prompt and position
        ids = tokenizer(PROMPTS[name])["input_ids"]
        got = greedy(gemma3_ours.model, ids, 24)
        at, gap = greedy_matches_or_near_tie(got, ref, ids, EOS)
        print(f"\n{name}: {tokenizer.decode(got)!r}")
        if at is not None:
            print(f"{name}: diverged at step {at}; reference top-2 gap {gap:.2e} (near-tie)")
            assert gap <= 1e-3, f"{name}: diverged at step {at} without a near-tie ({gap})"
