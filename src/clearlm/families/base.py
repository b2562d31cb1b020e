"""What a model family is: how its checkpoints, in either format, map onto ours.

A family module holds only what differs from the shared layers (style.md, after mlx-lm), for
both formats side by side: ``Family`` (config.json → ModelConfig fields, the parameter-name
renames, weight rewrites such as a Conv1D transpose) and ``GGUFArch`` (the llama.cpp
architecture's metadata keys read and their mapping, its tensor-name table, its layout fixes).
Transforms several families share live once in :mod:`clearlm.families.transforms`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clearlm.config import ROPE_SCALINGS, ModelConfig, RopeScaling, yarn_mscale
from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.families.transforms import StateDict

# GGUF metadata keys (under ``{arch}.``) that config_from_gguf reads for every architecture with
# RoPE (mapped in rope_from_gguf), and the head-size keys; a family's GGUFArch.keys starts from
# them (the rule for every other key: clearlm.loading.gguf_keys).
ROPE_KEYS = frozenset(
    {
        "rope.freq_base",  # → rope_theta
        "rope.dimension_count",  # → rope_dim (partial rotary)
        "rope.scaling.type",  # "none" | "linear" | "yarn"; longrope refused
        "rope.scaling.factor",  # → RopeScaling(type, factor)
        "rope.scale_linear",  # the factor's older name (llama.cpp reads it when factor is absent)
        "rope.scaling.original_context_length",  # yarn (default: context_length)
        "rope.scaling.yarn_beta_fast",  # yarn (default 32)
        "rope.scaling.yarn_beta_slow",  # yarn (default 1)
    }
)
HEAD_KEYS = frozenset({"attention.key_length", "attention.value_length"})  # → head_dim


class HFConfig:
    """A ``config.json`` dict with lookups that name the key and the file when one is missing."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def req(self, key: str) -> Any:
        """The value of a required key. Raises InvalidModelFileError naming key and file."""
        if self.data.get(key) is None:
            raise InvalidModelFileError(f"{self.source}: required key {key!r} is missing")
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value


def rope_from_hf(c: HFConfig, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """rope_theta and rope_scaling from either layout transformers writes.

    transformers ≥ 5 saves ``rope_parameters`` {"rope_type", "rope_theta", "factor", ...};
    older files have top-level ``rope_theta`` and ``rope_scaling`` {"type"|"rope_type", ...}.
    """
    p = dict(params if params is not None else c.get("rope_parameters") or {})
    legacy = c.get("rope_scaling") or {}
    theta = p.get("rope_theta", c.get("rope_theta", 10000.0))
    p = {**legacy, **p}
    kind = p.get("rope_type", p.get("type", "default"))
    if kind == "default":
        return {"rope_theta": float(theta), "rope_scaling": None}
    if kind not in ROPE_SCALINGS:
        raise UnsupportedModelError(
            f"{c.source}: rope scaling {kind!r} is not supported; supported: "
            + ", ".join(ROPE_SCALINGS)
        )
    original = p.get("original_max_position_embeddings", c.get("max_position_embeddings", 0))
    factor = float(p["factor"])
    scaling = RopeScaling(
        kind=kind,
        factor=factor,
        original_context=int(original),
        low_freq_factor=float(p.get("low_freq_factor", 1.0)),
        high_freq_factor=float(p.get("high_freq_factor", 4.0)),
        **(_yarn_from_hf(p, factor) if kind == "yarn" else {}),
    )
    out: dict[str, Any] = {"rope_theta": float(theta), "rope_scaling": scaling}
    if kind == "dynamic":
        # max_position_embeddings stays the trained length; dynamic NTK exists to run past it.
        out["context_length"] = int(scaling.original_context * scaling.factor)
    return out


def _yarn_from_hf(p: dict[str, Any], factor: float) -> dict[str, Any]:
    """YaRN's optional keys, with transformers' defaults (_compute_yarn_parameters)."""
    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all:  # DeepSeek's form
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention = yarn_mscale(factor)
    return dict(
        beta_fast=float(p.get("beta_fast") or 32),
        beta_slow=float(p.get("beta_slow") or 1),
        attention_factor=float(attention),
        truncate=bool(p.get("truncate", True)),
    )


def whole_heads(c: HFConfig, d_model: int, n_heads: int) -> int:
    """hidden_size / num_attention_heads, which must divide exactly when head_dim is absent."""
    if d_model % n_heads:
        raise InvalidModelFileError(
            f"{c.source}: hidden_size ({d_model}) is not a multiple of num_attention_heads "
            f"({n_heads}) and head_dim is absent"
        )
    return d_model // n_heads


def decoder_core(c: HFConfig) -> dict[str, Any]:
    """The fields every Llama-style config.json spells the same way (rope_from_hf may
    override context_length)."""
    d_model = int(c.req("hidden_size"))
    n_heads = int(c.req("num_attention_heads"))
    return dict(
        vocab_size=int(c.req("vocab_size")),
        d_model=d_model,
        n_layers=int(c.req("num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=int(c.get("num_key_value_heads", n_heads)),
        head_dim=int(c.get("head_dim", whole_heads(c, d_model, n_heads))),
        d_ff=int(c.req("intermediate_size")),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        context_length=int(c.req("max_position_embeddings")),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


HF_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}


def activation_from_hf(name: str, source: str) -> str:
    """transformers' ACT2FN name → ours; UnsupportedModelError for others."""
    if name not in HF_ACTIVATIONS:
        raise UnsupportedModelError(
            f"{source}: activation {name!r} is not supported; supported: "
            + ", ".join(HF_ACTIVATIONS)
        )
    return HF_ACTIVATIONS[name]


def strip_model_prefix(name: str) -> str | None:
    """transformers' Llama-style names are ours behind a ``model.`` prefix."""
    return name.removeprefix("model.")


@dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
        name: display name ("Llama", "Gemma 2", ...).
        model_types: the ``model_type`` values of config.json this family reads.
        config: HFConfig → ModelConfig fields (``architecture`` is filled in by the loader).
        renames: (regex, replacement) pairs applied in order to each checkpoint name, after
            the ``model.`` prefix is stripped; a name mapped to "" is dropped (unused buffers).
        convert: rewrites the renamed state dict (split fused projections, transpose Conv1D).
    """

    name: str
    model_types: tuple[str, ...]
    config: Callable[[HFConfig], dict[str, Any]]
    renames: tuple[tuple[str, str], ...] = ()
    convert: Callable[[StateDict, ModelConfig], StateDict] = field(default=lambda s, c: s)
    prefixes: tuple[str, ...] = ("model.",)

    def rename(self, name: str) -> str:
        for prefix in self.prefixes:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        for pattern, repl in self.renames:
            name = re.sub(pattern, repl, name)
        return name

    def build_config(self, c: HFConfig, model_type: str) -> ModelConfig:
        return ModelConfig(architecture=model_type, family=self.name, **self.config(c))


# --- GGUF: llama.cpp names tensors ``blk.{i}.attn_q.weight`` etc. for every architecture; each
# family's table maps them to our parameter names (Hugging Face style).

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
QKV_BIASES = {
    f"blk.{{i}}.attn_{x}.bias": f"layers.{{i}}.self_attn.{x}_proj.bias" for x in ("q", "k", "v")
}
QK_NORMS = {
    "blk.{i}.attn_q_norm.weight": "layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "layers.{i}.self_attn.k_norm.weight",
}

# Mixture of experts (model/moe.py). llama.cpp's converters stack each block's experts into one
# 3-D tensor per matrix, (E, F, D) for gate and up and (E, D, F) for down, in expert order;
# they map to a name without an expert index, which transforms.split_experts turns into one
# view per expert (and the compact load into one packed row band per expert).
EXPERT_TENSORS = {
    "blk.{i}.ffn_gate_inp.weight": "layers.{i}.mlp.gate.weight",  # the router, (E, D)
    "blk.{i}.ffn_gate_exps.weight": "layers.{i}.mlp.experts.gate_proj.weight",
    "blk.{i}.ffn_up_exps.weight": "layers.{i}.mlp.experts.up_proj.weight",
    "blk.{i}.ffn_down_exps.weight": "layers.{i}.mlp.experts.down_proj.weight",
}
SHARED_EXPERT_TENSORS = {  # Qwen2-MoE's shared expert and its sigmoid gate ((D,) in the file)
    "blk.{i}.ffn_gate_inp_shexp.weight": "layers.{i}.mlp.shared_expert_gate.weight",
    "blk.{i}.ffn_gate_shexp.weight": "layers.{i}.mlp.shared_expert.gate_proj.weight",
    "blk.{i}.ffn_up_shexp.weight": "layers.{i}.mlp.shared_expert.up_proj.weight",
    "blk.{i}.ffn_down_shexp.weight": "layers.{i}.mlp.shared_expert.down_proj.weight",
}
EXPERT_KEYS = frozenset({"expert_count", "expert_used_count"})


def moe_from_gguf(m: dict[str, Any], a: str, norm_topk_prob: bool) -> dict[str, Any]:
    """``{a}.expert_count`` E and ``{a}.expert_used_count`` k → ModelConfig's expert fields; no
    experts (absent or 0) → {}. llama.cpp hard-codes the renormalisation per architecture
    (llm_build_*: ``build_moe_ffn(..., norm_w, ...)``) and so does the caller.

    Raises:
        UnsupportedModelError: one count without the other (llama.cpp asserts on both).
    """
    n, used = int(m.get(f"{a}.expert_count", 0)), int(m.get(f"{a}.expert_used_count", 0))
    if bool(n) != bool(used):
        key = f"{a}.expert_count" if n else f"{a}.expert_used_count"
        raise UnsupportedModelError(
            f"metadata key {key!r} = {n or used} needs {a}.expert_"
            f"{'used_count' if n else 'count'} (a mixture of experts has both), which is "
            "missing or 0"
        )
    if not n:
        return {}
    return dict(n_experts=n, n_experts_used=used, norm_topk_prob=norm_topk_prob)


GGUFConfig = Callable[[dict[str, Any], str], dict[str, Any]]


@dataclass(frozen=True)
class GGUFArch:
    """One llama.cpp architecture (``general.architecture``).

    Attributes:
        name: the architecture's name in the file.
        tensors: GGUF tensor name → our parameter name (``{i}`` = block index).
        unpermute_qk: llama.cpp's converter permuted Q/K rows for its RoPE layout (llama only;
            undone by loading.transforms.unpermute_rope_rows).
        family: display name for ``clearlm info``; default: the architecture name.
        config: (metadata, arch) → the ModelConfig fields this architecture adds to the sizes
            and RoPE that every architecture has (loading/gguf_config.py).
        norm_eps_key: the metadata key (after ``{arch}.``) holding the norm's ε.
        convert: rewrites the renamed, dequantized state dict (e.g. splits a fused QKV).
        norm_shift: what llama.cpp's converter added to every ``*norm.weight`` (Gemma: 1, so
            the file holds 1 + w); subtracted in float32 right after dequantizing.
        keys: the metadata keys (after ``{arch}.``) read for this architecture beyond the sizes
            and ``norm_eps_key``: the generic RoPE and head keys and what ``config`` reads. Any
            other key is refused unless inert or neutral (loading/gguf_keys.py).
        rope_freqs: the file may hold llama.cpp's ``rope_freqs.weight`` (Llama 3.1+).
    """

    name: str
    tensors: dict[str, str]
    unpermute_qk: bool = False
    family: str = ""
    config: GGUFConfig = field(default=lambda m, a: {})
    norm_eps_key: str = "attention.layer_norm_rms_epsilon"
    convert: Callable[[StateDict, ModelConfig], StateDict] = field(default=lambda s, c: s)
    norm_shift: float = 0.0
    keys: frozenset[str] = ROPE_KEYS | HEAD_KEYS
    rope_freqs: bool = False
