"""OPT (Zhang et al. 2022, "OPT: Open Pre-trained Transformer Language Models").

What differs from the shared (Llama-default) layers, read from transformers'
``models/opt/modeling_opt.py`` (a port of metaseq):

- stage 1: a learned position table with 2 extra leading rows: position p reads row p + 2
  (``OPTLearnedPositionalEmbedding.offset``, a fairseq padding convention);
- stage 2: biases on Q, K, V and the output projection (``enable_bias``); q is multiplied by
  Hd^-0.5 before q·kᵀ, the same as the shared attention's default scale;
- stage 3: LayerNorm (ε = 1e-5, nn.LayerNorm's default: OPT's config has no ε key), a plain MLP
  ``fc1`` → ReLU → ``fc2``. Blocks are pre-norm when ``do_layer_norm_before`` (125m, 1.3b and up)
  and post-norm otherwise (350m): then there is no final LayerNorm either. A final norm is also
  absent when ``_remove_final_layer_norm`` is set (checkpoints fine-tuned before v4.20.1);
- stage 4: when ``word_embed_proj_dim`` E differs from D (350m: 512 vs 1024), tokens are embedded
  in E, ``project_in`` maps E → D before the positions are added and ``project_out`` maps D → E
  before the output projection (tied to the (V, E) embedding): ModelConfig.embed_dim.

``layer_norm_elementwise_affine = false`` checkpoints hold no LayerNorm γ/β: we fill γ = 1,
β = 0, which is what a LayerNorm without affine parameters computes.
llama.cpp has no OPT architecture, so there is no GGUF export of OPT to read.
"""

from __future__ import annotations

from typing import Any

import torch

from clearlm.config import ModelConfig
from clearlm.families.base import Family, HFConfig, activation_from_hf
from clearlm.families.transforms import StateDict


def opt_config(c: HFConfig) -> dict[str, Any]:
    """config.json → ModelConfig fields; absent optional keys take OPTConfig's defaults."""
    d_model = int(c.req("hidden_size"))
    n_heads = int(c.req("num_attention_heads"))
    pre_norm = bool(c.get("do_layer_norm_before", True))
    bias = bool(c.get("enable_bias", True))
    return dict(
        vocab_size=int(c.req("vocab_size")),
        d_model=d_model,
        n_layers=int(c.req("num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=n_heads,
        head_dim=d_model // n_heads,
        d_ff=int(c.req("ffn_dim")),
        norm_eps=1e-5,
        context_length=int(c.req("max_position_embeddings")),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        position="learned",
        position_offset=2,
        embed_dim=int(c.get("word_embed_proj_dim", d_model)),
        attn_bias=bias,
        attn_out_bias=bias,
        norm="layer",
        block="pre" if pre_norm else "post",
        ffn="mlp",
        activation=activation_from_hf(c.get("activation_function", "relu"), c.source),
        mlp_bias=bias,
        final_norm=pre_norm and not c.get("_remove_final_layer_norm", False),
    )


def norm_names(config: ModelConfig) -> list[str]:
    """Our names of every LayerNorm the config builds."""
    names = [
        f"layers.{i}.{n}"
        for i in range(config.n_layers)
        for n in ("input_layernorm", "post_attention_layernorm")
    ]
    return names + (["norm"] if config.final_norm else [])


def opt_convert(state: StateDict, config: ModelConfig) -> StateDict:
    """Fill γ = 1, β = 0 for checkpoints without LayerNorm parameters (elementwise_affine off).

    Only when no norm parameter is present at all: a checkpoint missing just some of them is
    broken, and check_shapes reports it.
    """
    names = norm_names(config)
    if any(f"{n}.weight" in state or f"{n}.bias" in state for n in names):
        return state
    dtype = state["embed_tokens.weight"].dtype
    state = dict(state)
    for n in names:
        state[f"{n}.weight"] = torch.ones(config.d_model, dtype=dtype)
        state[f"{n}.bias"] = torch.zeros(config.d_model, dtype=dtype)
    return state


OPT = Family(
    "OPT",
    ("opt",),
    opt_config,
    renames=(
        (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
        (r"\.self_attn_layer_norm\.", ".input_layernorm."),
        # the block's FFN norm and the decoder's final norm share the name final_layer_norm
        (r"^(layers\.\d+)\.final_layer_norm\.", r"\1.post_attention_layernorm."),
        (r"^final_layer_norm\.", "norm."),
        (r"\.fc1\.", ".mlp.up_proj."),
        (r"\.fc2\.", ".mlp.down_proj."),
    ),
    convert=opt_convert,
    # OPTForCausalLM saves "model.decoder.…"; some older hub files have "decoder.…".
    prefixes=("model.decoder.", "decoder."),
)
FAMILIES = (OPT,)
GGUF_ARCHS = ()  # llama.cpp has no OPT architecture
