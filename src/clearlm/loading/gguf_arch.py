"""What differs between GGUF architectures: one tensor-name table and one config builder each.

llama.cpp names tensors ``blk.{i}.attn_q.weight`` etc. for every architecture; each table maps
them to our parameter names (Hugging Face style). Adding an architecture means adding a row to
ARCHITECTURES, not string checks scattered through the loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError, UnsupportedModelError

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
    """

    name: str
    tensors: dict[str, str]
    unpermute_qk: bool = False
    config: Callable[[dict[str, Any], str], dict[str, Any]] = field(default=lambda m, a: {})


ARCHITECTURES: dict[str, GGUFArch] = {
    "llama": GGUFArch("llama", COMMON_TENSORS, unpermute_qk=True),
}


def gguf_arch(name: str | None, source: str) -> GGUFArch:
    """The table for ``general.architecture``; UnsupportedModelError listing the supported ones."""
    if name not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{source}: architecture {name!r} is not supported; supported: "
            + ", ".join(ARCHITECTURES)
        )
    return ARCHITECTURES[name]


def config_from_gguf(metadata: dict[str, Any], tensor_names: set[str], source: str) -> ModelConfig:
    """ModelConfig from GGUF metadata: the keys every architecture has, then its own extras.

    Raises:
        UnsupportedModelError: unknown architecture. InvalidModelFileError: a key is missing.
    """
    arch_name = metadata.get("general.architecture")
    arch = gguf_arch(arch_name, source)

    def req(key: str) -> Any:
        full = f"{arch_name}.{key}"
        if full not in metadata:
            raise InvalidModelFileError(f"{source}: required metadata key {full!r} is missing")
        return metadata[full]

    d_model = int(req("embedding_length"))
    n_heads = int(req("attention.head_count"))
    # head_count_kv is optional in the GGUF spec: absent means plain multi-head attention.
    n_kv_heads = int(metadata.get(f"{arch_name}.attention.head_count_kv", n_heads))
    head_dim = int(metadata.get(f"{arch_name}.attention.key_length", d_model // n_heads))
    if "tokenizer.ggml.tokens" in metadata:
        vocab_size = len(metadata["tokenizer.ggml.tokens"])
    else:
        vocab_size = int(req("vocab_size"))
    fields: dict[str, Any] = dict(
        architecture=arch_name,
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=int(req("block_count")),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        d_ff=int(req("feed_forward_length")),
        norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        # llama.cpp's own default when a file omits the base (llama-model.cpp).
        rope_theta=float(metadata.get(f"{arch_name}.rope.freq_base", 10000.0)),
        context_length=int(req("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        rope_dim=int(metadata.get(f"{arch_name}.rope.dimension_count", head_dim)),
    )
    fields.update(arch.config(metadata, arch_name))
    return ModelConfig(**fields)
