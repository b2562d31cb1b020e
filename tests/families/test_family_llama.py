"""Llama (with each RoPE scaling), Mistral (sliding window), Qwen2 (Q/K/V biases) and Qwen3
(per-head q/k RMSNorm) against tiny random transformers models."""

from __future__ import annotations

import pytest
from hf_tiny import (
    TINY,
    batch_tokens,
    build_case,
    check_greedy,
    check_logits,
    dequantized_reference,
    greedy_ours,
    greedy_reference,
    llama_like_gguf_writer,
    max_logit_diff,
    save_tiny,
)
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
    return build_case(CASES, request.param, tmp_path_factory)


def test_logits_match_transformers(tiny):
    check_logits(tiny, 1e-4)


def test_greedy_with_cache_matches_transformers(tiny):
    """24 new tokens after an 8-token prompt: past the Mistral case's 5-token window."""
    check_greedy(tiny)


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


# ------------------------------------------------------------- the same weights as GGUF files

GGUF_CASES = {
    "llama": (LlamaForCausalLM, LlamaConfig(**TINY)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**TINY)),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**TINY, head_dim=32)),
}


def write_llama_like_gguf(model, arch: str, path, qtype) -> dict[str, str]:
    """Write a transformers model as llama.cpp's convert_hf_to_gguf.py does for LlamaModel /
    Qwen2Model / Qwen3Model: its metadata keys and tensor names, Q/K rows permuted into
    llama.cpp's RoPE layout for "llama" only; matrices in `qtype`, vectors in F32.
    Returns GGUF name → transformers name."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    c = model.config
    w, names = llama_like_gguf_writer(model, arch, path)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    if arch == "qwen3":
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    back = {}
    for name, t in model.state_dict().items():
        a = t.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(a.shape)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if a.ndim == 2 and qtype != GGMLQuantizationType.F32:
            w.add_tensor(gguf_name, quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, a)
        back[gguf_name] = name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return back


@pytest.mark.parametrize("arch", list(GGUF_CASES))
def test_gguf_f32_and_q8_0_match_transformers(arch, tmp_path):
    """F32: equal to the original model. Q8_0: equal to transformers loading the same file
    (for qwen3, whose GGUF transformers builds with its default head_dim of 128 whatever the
    file says, the original model holding the file's dequantized weights)."""
    import torch
    from gguf import GGMLQuantizationType
    from transformers import AutoModelForCausalLM

    from clearlm.loading.checkpoint import load_gguf_model

    model_cls, config = GGUF_CASES[arch]
    hf_model = save_tiny(model_cls, config, tmp_path / "hf")
    tokens = batch_tokens(length=20)
    for qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0):
        path = tmp_path / f"{qtype.name}.gguf"
        back = write_llama_like_gguf(hf_model, arch, path, qtype)
        ours = load_gguf_model(path)
        assert ours.config.architecture == arch
        if qtype == GGMLQuantizationType.F32:
            ref = hf_model
        elif arch == "qwen3":
            ref = dequantized_reference(hf_model, arch, path, back)
        else:
            ref = AutoModelForCausalLM.from_pretrained(
                tmp_path, gguf_file=path.name, dtype=torch.float32
            ).eval()
        with torch.inference_mode():
            diff = (ours.model(tokens) - ref(tokens).logits).abs().max().item()
        print(f"\n{arch} GGUF {qtype.name}: max |Δlogit| = {diff:.2e}")
        assert diff <= 1e-4
