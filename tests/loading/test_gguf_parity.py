"""GGUF metadata that changes the numbers, mapped (issue 7, item 1): tiny transformers models
written as GGUF files with the keys llama.cpp reads (linear and YaRN RoPE scaling, Llama 3's
rope_freqs tensor, sliding windows, partial rotary, Gemma 2's soft-caps, Gemma 3's scaled global
layers) give transformers' logits on the same weights. The walk over every key is in
test_gguf_keys.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gguf_keys_writer import gguf_vs_reference, write_gguf
from hf_tiny import TINY, batch_tokens, save_tiny
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.loading.checkpoint import load_gguf_model, open_checkpoint
from clearlm.loading.hf import load_hf_model
from clearlm.model.positions import rope_inv_freq

FOUR = dict(TINY, num_hidden_layers=4)
S, F = "sliding_attention", "full_attention"


def test_issue_linear_rope_scaling_matches_transformers(tmp_path):
    """The issue's input: llama.rope.scaling.type = "linear", factor 4.0. Before, the file loaded
    with rope_scaling None and its logits were the unscaled model's."""
    config = LlamaConfig(**TINY, rope_scaling={"type": "linear", "factor": 4.0})
    scaled = save_tiny(LlamaForCausalLM, config, tmp_path / "hf")
    keys = {"rope.freq_base": 10000.0, "rope.scaling.type": "linear", "rope.scaling.factor": 4.0}
    path = write_gguf(scaled, "llama", tmp_path / "linear.gguf", keys)
    cfg = load_gguf_model(path).config
    assert (cfg.rope_scaling.kind, cfg.rope_scaling.factor) == ("linear", 4.0)
    diff = gguf_vs_reference(scaled, path)
    unscaled = save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), tmp_path / "plain")
    gap = gguf_vs_reference(unscaled, path)  # same weights (same seed), no scaling
    print(f"\nlinear ×4: max |Δlogit| = {diff:.2e} (unscaled model: {gap:.2f})")
    assert diff <= 1e-4 and gap > 0.1


def test_old_scale_linear_key_and_default_type(tmp_path):
    """llama.cpp reads the factor from rope.scale_linear when rope.scaling.factor is absent, and
    a missing rope.scaling.type means "linear"; "none" turns the factor off."""
    config = LlamaConfig(**TINY, rope_scaling={"type": "linear", "factor": 2.0})
    hf_model = save_tiny(LlamaForCausalLM, config, tmp_path / "hf")
    path = write_gguf(hf_model, "llama", tmp_path / "old.gguf", {"rope.scale_linear": 2.0})
    assert gguf_vs_reference(hf_model, path) <= 1e-4
    keys = {"rope.scaling.type": "none", "rope.scaling.factor": 2.0}
    path = write_gguf(hf_model, "llama", tmp_path / "none.gguf", keys)
    assert load_gguf_model(path).config.rope_scaling is None


def llama3_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors): Llama 3's scaling
    as one divisor per frequency, written as the rope_freqs.weight tensor."""
    base, factor = rope["rope_theta"], rope["factor"]
    low, high, orig = rope["low_freq_factor"], rope["high_freq_factor"], rope["orig"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_rope_freqs_tensor_matches_llama3_scaling(tmp_path):
    """Llama 3.1+ GGUFs carry their rope scaling as rope_freqs.weight (no metadata key):
    used as frequency divisors, it gives transformers' llama3 rope_type."""
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    rope |= dict(original_max_position_embeddings=64, rope_theta=10000.0)
    hf_model = save_tiny(LlamaForCausalLM, LlamaConfig(**TINY, rope_parameters=rope), tmp_path)
    factors = llama3_rope_freqs(rope | {"orig": 64}, 16)
    assert 1.0 < factors.max() and factors.min() == 1.0  # all three bands occur
    path = write_gguf(
        hf_model,
        "llama",
        tmp_path / "l3.gguf",
        {"rope.freq_base": 1e4},
        {"rope_freqs.weight": factors},
    )
    assert load_gguf_model(path).config.rope_scaling.kind == "factors"
    diff = gguf_vs_reference(hf_model, path)
    print(f"\nrope_freqs: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4
    wrong = write_gguf(
        hf_model, "llama", tmp_path / "w.gguf", {}, {"rope_freqs.weight": factors[:3]}
    )
    with pytest.raises(InvalidModelFileError, match="rope_freqs.weight"):
        _ = open_checkpoint(wrong).config
    both = write_gguf(
        hf_model,
        "llama",
        tmp_path / "b.gguf",
        {"rope.scaling.factor": 2.0},
        {"rope_freqs.weight": factors},
    )
    with pytest.raises(UnsupportedModelError, match="llama.rope.scaling.factor"):
        _ = open_checkpoint(both).config
    # any tensor the architecture's table does not name (here Phi-3's LongRoPE factors)
    extra = {"rope_factors_long.weight": factors}
    other = write_gguf(hf_model, "llama", tmp_path / "o.gguf", {"rope.freq_base": 1e4}, extra)
    with pytest.raises(UnsupportedModelError, match="rope_factors_long.weight"):
        load_gguf_model(other)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
YARN_BETAS = YARN | {"beta_fast": 4.0, "beta_slow": 0.5}  # ramp over pairs 1–4


@pytest.mark.parametrize("rope", [YARN, YARN_BETAS], ids=["yarn", "yarn-betas"])
def test_yarn_hf_folder_matches_transformers(rope, tmp_path):
    """YaRN from config.json (transformers' rope_type "yarn"): its ramp blends pairs 1–2 (default
    betas) or 1–3 (4, 0.5) of the 8 between kept and stretched frequencies."""
    config = Qwen2Config(**TINY, rope_parameters=rope | {"rope_theta": 10000.0})
    hf_model = save_tiny(Qwen2ForCausalLM, config, tmp_path)
    scaling = load_hf_model(tmp_path).config.rope_scaling
    assert scaling.kind == "yarn" and scaling.attention_factor == 0.1 * math.log(4.0) + 1
    changed = rope_inv_freq(16, 1e4, scaling, 40) != rope_inv_freq(16, 1e4, None, 40)
    assert 0 < int(changed.sum()) < 8  # the ramp keeps the fastest pairs, stretches the rest
    tokens = batch_tokens(length=40)
    with torch.inference_mode():
        diff = (load_hf_model(tmp_path).model(tokens) - hf_model(tokens).logits).abs().max().item()
    print(f"\n{rope}: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4


PARITY = {
    # Qwen 2.5/3 long-context GGUFs: YaRN with llama.cpp's keys.
    "qwen2-yarn": (
        Qwen2ForCausalLM,
        Qwen2Config(**TINY, rope_parameters=YARN_BETAS | {"rope_theta": 10000.0}),
        "qwen2",
        {
            "rope.freq_base": 10000.0,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 128,
            "rope.scaling.yarn_beta_fast": 4.0,
            "rope.scaling.yarn_beta_slow": 0.5,
        },
    ),
    # llama.cpp writes Mistral as "llama"; a window in the file means Mistral's.
    "llama-window": (
        MistralForCausalLM,
        MistralConfig(**TINY, sliding_window=5),
        "llama",
        {"rope.freq_base": 10000.0, "attention.sliding_window": 5},
    ),
    "phi3-partial-window": (
        Phi3ForCausalLM,
        Phi3Config(
            **TINY,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            sliding_window=5,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
        ),
        "phi3",
        {"rope.freq_base": 1e4, "rope.dimension_count": 8, "attention.sliding_window": 5},
    ),
    "gemma2-softcaps": (
        Gemma2ForCausalLM,
        Gemma2Config(
            **FOUR,
            head_dim=16,
            query_pre_attn_scalar=16,  # = head_dim: llama.cpp's scale below 27B
            attn_logit_softcapping=2.0,
            final_logit_softcapping=1.5,
            sliding_window=4,
        ),
        "gemma2",
        {
            "attention.key_length": 16,
            "attention.value_length": 16,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 1.5,
            "attention.sliding_window": 4,
        },
    ),
    "gemma3-linear-global": (
        Gemma3ForCausalLM,
        Gemma3TextConfig(
            **FOUR,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=4,
            layer_types=[S, F, S, S],
            rope_parameters={
                F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                S: {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
        "gemma3",
        {
            "attention.key_length": 16,
            "attention.value_length": 16,
            "rope.freq_base": 1e5,
            "rope.freq_base_swa": 1e4,
            "rope.scaling.type": "linear",
            "rope.scaling.factor": 2.0,
            "attention.sliding_window": 4,
            "attention.sliding_window_pattern": [True, False, True, True],
        },
    ),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_mapped_keys_match_transformers(case, tmp_path):
    """Each mapped key with a transformers counterpart, 20 tokens (past the 4–5 token windows)."""
    model_cls, config, arch, keys = PARITY[case]
    hf_model = save_tiny(model_cls, config, tmp_path / "hf")
    path = write_gguf(hf_model, arch, tmp_path / f"{case}.gguf", keys)
    diff = gguf_vs_reference(hf_model, path)
    print(f"\n{case}: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4
