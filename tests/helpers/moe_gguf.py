"""Write a tiny transformers mixture-of-experts model as llama.cpp's convert_hf_to_gguf.py does
(LlamaModel for Mixtral, Qwen2MoeModel / Qwen3MoeModel, OlmoeModel): its metadata keys, each
block's experts stacked into one (E, F, D) / (E, D, F) tensor per matrix (``ffn_*_exps``), the
router and the shared expert's gate in F32 (the converter keeps ``ffn_gate_inp`` F32), Q/K rows
permuted into llama.cpp's RoPE layout for "llama" only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from hf_tiny import llama_like_gguf_writer
from tiny_gguf import permute_for_llama_cpp


def write_moe_gguf(model, arch: str, path: Path, qtype=GGMLQuantizationType.F32) -> None:
    """model: a transformers MixtralForCausalLM / Qwen2Moe / Qwen3Moe / Olmoe (in memory, v5:
    ``mlp.experts.gate_up_proj`` (E, 2F, D) and ``down_proj`` (E, D, F)); arch: "llama",
    "qwen2moe", "qwen3moe" or "olmoe"; matrices in ``qtype``, vectors and routers in F32."""
    c = model.config
    w, names = llama_like_gguf_writer(model, arch, path)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_expert_count(getattr(c, "num_local_experts", None) or c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    if arch == "qwen3moe":
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if arch == "olmoe" and c.clip_qkv is not None:
        w.add_clamp_kqv(c.clip_qkv)

    def put(name: str, a: np.ndarray) -> None:
        if a.ndim >= 2 and qtype != GGMLQuantizationType.F32 and "ffn_gate_inp" not in name:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)

    for name, t in model.state_dict().items():
        a = t.float().numpy()
        if ".mlp.experts." in name:
            i = int(name.split(".layers.")[1].split(".")[0])
            if name.endswith("gate_up_proj"):  # (E, 2F, D): rows [gate | up]
                f = a.shape[1] // 2
                put(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(a[:, :f]))
                put(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(a[:, f:]))
            else:  # down_proj (E, D, F)
                put(f"blk.{i}.ffn_down_exps.weight", a)
            continue
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            a = permute_for_llama_cpp(a, heads)
        put(names.get_name(name, try_suffixes=(".weight", ".bias")), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
