"""Llama (with each RoPE scaling), Mistral (sliding window), Qwen2 (Q/K/V biases) and Qwen3
(per-head q/k RMSNorm) against tiny random transformers models."""

from __future__ import annotations

import pytest
from hf_tiny import TINY, batch_tokens, greedy_ours, greedy_reference, max_logit_diff, save_tiny
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from clearlm.loading.hf import load_hf_model

ROPE = {
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 10000.0,
    },
}

CASES = {
    "llama": (LlamaForCausalLM, LlamaConfig(**TINY)),
    "llama-tied": (LlamaForCausalLM, LlamaConfig(**TINY, tie_word_embeddings=True)),
    "llama-linear": (LlamaForCausalLM, LlamaConfig(**TINY, rope_parameters=ROPE["linear"])),
    "llama3-scaling": (LlamaForCausalLM, LlamaConfig(**TINY, rope_parameters=ROPE["llama3"])),
    "mistral-window": (MistralForCausalLM, MistralConfig(**TINY, sliding_window=5)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**TINY)),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**TINY, head_dim=32)),
}


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tmp_path_factory):
    model_cls, config = CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, save_tiny(model_cls, config, folder), folder


def test_logits_match_transformers(tiny):
    name, hf_model, folder = tiny
    diff = max_logit_diff(hf_model, folder, batch_tokens(length=20))
    print(f"\n{name}: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4


def test_greedy_with_cache_matches_transformers(tiny):
    """24 new tokens after an 8-token prompt: past the Mistral case's 5-token window."""
    name, hf_model, folder = tiny
    prompt = batch_tokens(seed=2, batch=1, length=8)[0].tolist()
    assert greedy_ours(folder, prompt, 24) == greedy_reference(hf_model, prompt, 24)


def test_config_mapping(tiny):
    name, _, folder = tiny
    cfg = load_hf_model(folder).config
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == (64, 2, 4, 2)
    if name == "mistral-window":
        assert cfg.sliding_window == 5 and set(cfg.layer_types) == {"sliding"}
    if name.startswith("qwen2"):
        assert cfg.attn_bias and not cfg.attn_out_bias
    if name == "qwen3":
        assert cfg.qk_norm and cfg.head_dim == 32
    if name == "llama3-scaling":
        assert cfg.rope_scaling.kind == "llama3" and cfg.rope_scaling.original_context == 16


def test_dynamic_rope_past_original_context(tmp_path):
    """Dynamic NTK scaling only changes anything past max_position_embeddings: a 16-token
    original context, factor 4, and 40-token sequences, decoded with the cache too."""
    config = LlamaConfig(**{**TINY, "max_position_embeddings": 16}, rope_parameters=ROPE["dynamic"])
    hf_model = save_tiny(LlamaForCausalLM, config, tmp_path)
    assert load_hf_model(tmp_path).config.context_length == 64
    diff = max_logit_diff(hf_model, tmp_path, batch_tokens(length=40))
    assert diff <= 1e-4
    prompt = batch_tokens(seed=3, batch=1, length=10)[0].tolist()
    assert greedy_ours(tmp_path, prompt, 30) == greedy_reference(hf_model, prompt, 30)
