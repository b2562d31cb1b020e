"""What differs between GGUF architectures: one tensor-name table and one config builder each.

llama.cpp names tensors ``blk.{i}.attn_q.weight`` etc. for every architecture; each table maps
them to our parameter names (Hugging Face style). Adding an architecture means adding a row to
ARCHITECTURES, not string checks scattered through the loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.families.gemma import gemma2_gguf_config, gemma3_gguf_config, gemma_gguf_config
from clearlm.families.gpt2 import split_qkv
from clearlm.families.llama import llama_gguf_config
from clearlm.families.phi3 import phi3_gguf_config, split_fused
from clearlm.loading.gguf_keys import (
    HEAD_KEYS,
    ROPE_KEYS,
    check_freq_factors,
    check_head_lengths,
    check_keys,
    refuse,
    rope_from_gguf,
    uniform,
)

# Tensors every llama.cpp decoder shares (token embedding, final norm, head, pre-norm block).
COMMON_TENSORS = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "layers.{i}.mlp.down_proj.weight",
}


@dataclass(frozen=True)
class GGUFArch:
    """One llama.cpp architecture.

    Attributes:
        tensors: GGUF tensor name → our parameter name (``{i}`` = block index).
        unpermute_qk: llama.cpp's converter permuted Q/K rows for its RoPE layout (llama only).
        config: extra ModelConfig fields from this architecture's metadata.
        norm_eps_key: the metadata key (after ``{arch}.``) holding the norm's ε.
        convert: rewrites the renamed, dequantized state dict (e.g. splits a fused QKV).
        norm_shift: what llama.cpp's converter added to every ``*norm.weight`` (Gemma: 1, so
            the file holds 1 + w); subtracted in float32 right after dequantizing.
        keys: the metadata keys (after ``{arch}.``) that ``config_from_gguf`` and ``config``
            read, beyond the sizes and ``norm_eps_key``; any other key is refused
            (loading/gguf_keys.py).
        rope_freqs: the file may hold llama.cpp's ``rope_freqs.weight`` (Llama 3.1+).
    """

    name: str
    tensors: dict[str, str]
    unpermute_qk: bool = False
    family: str = ""  # display name for `clearlm info`; default: the architecture name
    config: Callable[[dict[str, Any], str], dict[str, Any]] = field(default=lambda m, a: {})
    norm_eps_key: str = "attention.layer_norm_rms_epsilon"
    convert: Callable[[dict[str, torch.Tensor], ModelConfig], dict[str, torch.Tensor]] = field(
        default=lambda s, c: s
    )
    norm_shift: float = 0.0
    keys: frozenset[str] = ROPE_KEYS | HEAD_KEYS
    rope_freqs: bool = False


QKV_BIASES = {
    f"blk.{{i}}.attn_{x}.bias": f"layers.{{i}}.self_attn.{x}_proj.bias" for x in ("q", "k", "v")
}
QK_NORMS = {
    "blk.{i}.attn_q_norm.weight": "layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "layers.{i}.self_attn.k_norm.weight",
}

# GPT-2 as llama.cpp's converter writes it (convert_hf_to_gguf.py, GPT2Model): Conv1D weights
# already transposed to (out, in), one fused attn_qkv (rows [Q | K | V]), every LayerNorm and
# projection with a bias, a learned position table. Files from older converters repeat the tied
# embedding as output.weight; newer ones leave it out.
GPT2_TENSORS = {
    "token_embd.weight": "embed_tokens.weight",
    "position_embd.weight": "embed_positions.weight",
    "output_norm.weight": "norm.weight",
    "output_norm.bias": "norm.bias",
    "output.weight": "lm_head.weight",
} | {
    f"blk.{{i}}.{gguf}.{kind}": f"layers.{{i}}.{ours}.{kind}"
    for gguf, ours in (
        ("attn_norm", "input_layernorm"),
        ("attn_qkv", "self_attn.qkv_proj"),  # split by split_qkv
        ("attn_output", "self_attn.o_proj"),
        ("ffn_norm", "post_attention_layernorm"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
    )
    for kind in ("weight", "bias")
}

# Gemma 2/3 (convert_hf_to_gguf.py, Gemma2Model/Gemma3Model): four norms per block. llama.cpp
# calls the pre-FFN norm ffn_norm, which for Llama-style blocks is the post-attention norm.
GEMMA2_TENSORS = COMMON_TENSORS | {
    "blk.{i}.post_attention_norm.weight": "layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.post_ffw_norm.weight": "layers.{i}.post_feedforward_layernorm.weight",
}

# Phi-3 (Phi3MiniModel): fused attn_qkv (rows [Q | K | V]) and ffn_up holding [gate | up],
# split by families/phi3.py's split_fused.
PHI3_TENSORS = COMMON_TENSORS | {
    "blk.{i}.attn_qkv.weight": "layers.{i}.self_attn.qkv_proj.weight",
    "blk.{i}.ffn_up.weight": "layers.{i}.mlp.gate_up_proj.weight",
}

SOFTCAPS = frozenset({"attn_logit_softcapping", "final_logit_softcapping"})
WINDOW_KEYS = frozenset({"attention.sliding_window", "attention.sliding_window_pattern"})

ARCHITECTURES: dict[str, GGUFArch] = {
    # llama.cpp writes Mistral and SmolLM2 as "llama" too.
    "llama": GGUFArch(
        "llama",
        COMMON_TENSORS,
        unpermute_qk=True,
        family="Llama",
        config=llama_gguf_config,
        keys=ROPE_KEYS | HEAD_KEYS | {"attention.sliding_window"},
        rope_freqs=True,
    ),
    # Qwen2/2.5: Q/K/V biases; Q/K rows are stored in transformers' order (no permutation).
    "qwen2": GGUFArch(
        "qwen2",
        {**COMMON_TENSORS, **QKV_BIASES},
        family="Qwen2",
        config=lambda m, a: {"attn_bias": True},
    ),
    # Qwen3: RMSNorm on each head's q and k instead of biases.
    "qwen3": GGUFArch(
        "qwen3",
        {**COMMON_TENSORS, **QK_NORMS},
        family="Qwen3",
        config=lambda m, a: {"qk_norm": True},
    ),
    # GPT-2: learned positions, LayerNorm with bias, GELU (tanh) MLP; OPT and XGLM have no
    # llama.cpp architecture (families/opt.py, families/xglm.py).
    "gpt2": GGUFArch(
        "gpt2",
        GPT2_TENSORS,
        family="GPT-2",
        config=lambda m, a: dict(
            position="learned",
            norm="layer",
            ffn="mlp",
            activation="gelu_tanh",
            attn_bias=True,
            attn_out_bias=True,
            mlp_bias=True,
        ),
        norm_eps_key="attention.layer_norm_epsilon",
        convert=split_qkv,
        keys=HEAD_KEYS,  # learned positions: a rope.* key is refused
    ),
    # Gemma: √D embedding scale, (1 + w) norms stored as 1 + w, GeGLU; Q/K not permuted.
    "gemma": GGUFArch(
        "gemma", COMMON_TENSORS, family="Gemma", config=gemma_gguf_config, norm_shift=1.0
    ),
    "gemma2": GGUFArch(
        "gemma2",
        GEMMA2_TENSORS,
        family="Gemma 2",
        config=gemma2_gguf_config,
        norm_shift=1.0,
        keys=ROPE_KEYS | HEAD_KEYS | SOFTCAPS | WINDOW_KEYS,
    ),
    "gemma3": GGUFArch(
        "gemma3",
        GEMMA2_TENSORS | QK_NORMS,
        family="Gemma 3",
        config=gemma3_gguf_config,
        norm_shift=1.0,
        keys=ROPE_KEYS
        | HEAD_KEYS
        | WINDOW_KEYS
        | {"final_logit_softcapping", "rope.freq_base_swa"},
    ),
    "phi3": GGUFArch(
        "phi3",
        PHI3_TENSORS,
        family="Phi-3",
        config=phi3_gguf_config,
        convert=split_fused,
        keys=ROPE_KEYS | HEAD_KEYS | {"attention.sliding_window", "rope.scaling.attn_factor"},
    ),
}


def gguf_arch(name: str | None, source: str) -> GGUFArch:
    """The table for ``general.architecture``; UnsupportedModelError listing the supported ones."""
    if name not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{source}: architecture {name!r} is not supported; supported: "
            + ", ".join(ARCHITECTURES)
        )
    return ARCHITECTURES[name]


def config_from_gguf(
    metadata: dict[str, Any],
    tensor_names: set[str],
    source: str,
    rope_freqs: tuple[float, ...] | None = None,
) -> ModelConfig:
    """ModelConfig from GGUF metadata: the keys every architecture has, then its own extras.

    Args:
        rope_freqs: the values of the file's ``rope_freqs.weight`` tensor, when it has one.

    Raises:
        UnsupportedModelError: unknown architecture; a key or value clearlm does not implement
            (loading/gguf_keys.py). InvalidModelFileError: a key is missing.
    """
    arch_name = metadata.get("general.architecture")
    arch = gguf_arch(arch_name, source)
    check_keys(metadata, arch_name, arch.keys | {arch.norm_eps_key}, source)

    def req(key: str) -> Any:
        full = f"{arch_name}.{key}"
        if full not in metadata:
            raise InvalidModelFileError(f"{source}: required metadata key {full!r} is missing")
        return uniform(metadata[full], full, source)

    d_model = int(req("embedding_length"))
    n_heads = int(req("attention.head_count"))
    # head_count_kv is optional in the GGUF spec: absent means plain multi-head attention.
    kv_key = f"{arch_name}.attention.head_count_kv"
    n_kv_heads = int(uniform(metadata.get(kv_key, n_heads), kv_key, source))
    head_dim = int(metadata.get(f"{arch_name}.attention.key_length", d_model // n_heads))
    check_head_lengths(metadata, arch_name, head_dim, source)
    if "tokenizer.ggml.tokens" in metadata:
        vocab_size = len(metadata["tokenizer.ggml.tokens"])
    else:
        vocab_size = int(req("vocab_size"))
    rope_dim_key = f"{arch_name}.rope.dimension_count"
    rope_dim = int(metadata.get(rope_dim_key, head_dim))
    if arch.unpermute_qk and rope_dim != head_dim:
        # The converter's Q/K row permutation spans the whole head; llama.cpp then rotates
        # adjacent pairs of the first rope_dim rows only, which no rotate-half layout equals.
        raise refuse(source, rope_dim_key, rope_dim, f"partial rotary, head_dim {head_dim}")
    if rope_freqs is not None:
        if not arch.rope_freqs:
            raise UnsupportedModelError(
                f"{source}: tensor 'rope_freqs.weight' is not supported for {arch_name}"
            )
        check_freq_factors(rope_freqs, rope_dim, source)
    fields: dict[str, Any] = dict(
        architecture=arch_name,
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=int(req("block_count")),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=int(req("feed_forward_length")),
        norm_eps=float(req(arch.norm_eps_key)),
        # llama.cpp's own default when a file omits the base (llama-model.cpp).
        rope_theta=float(metadata.get(f"{arch_name}.rope.freq_base", 10000.0)),
        context_length=int(req("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        rope_dim=rope_dim,
    )
    if "rope.scaling.type" in arch.keys:
        fields["rope_scaling"] = rope_from_gguf(metadata, arch_name, source, rope_freqs)
    fields["family"] = arch.family or arch_name
    fields.update(arch.config(metadata, arch_name))
    return ModelConfig(**fields)
