"""XGLM (Lin et al. 2021, "Few-shot Learning with Multilingual Language Models"), a fairseq model.

What differs from the shared (Llama-default) layers, read from transformers'
``models/xglm/modeling_xglm.py``:

- stage 1: the token embedding is multiplied by √D when ``scale_embedding`` (Vaswani et al.
  2017, §3.4), then fixed sinusoidal encodings are added, in fairseq's layout (all sines, then
  all cosines; see positions.sinusoidal_table) with 2 leading rows: position p reads row p + 2;
- stage 2: biases on Q, K, V and the output projection; q is scaled by Hd^-0.5 (the default);
- stage 3: pre-norm LayerNorm blocks (ε = 1e-5, nn.LayerNorm's default), a plain MLP
  ``fc1`` → GELU (exact erf form by default) → ``fc2``, all with biases;
- stage 4: a final LayerNorm ``layer_norm``; the output projection is tied to the embedding.

transformers zeroes the sinusoid row ``pad_token_id``; rows 0 and 1 are never read (offset 2),
so that matters only for a pad id ≥ 2, which no released XGLM uses: refused.
llama.cpp has no XGLM architecture, so there is no GGUF export of XGLM to read.
"""

from __future__ import annotations

import math
from typing import Any

from clearlm.errors import UnsupportedModelError
from clearlm.families.base import Family, HFConfig, activation_from_hf


def xglm_config(c: HFConfig) -> dict[str, Any]:
    """config.json → ModelConfig fields; absent optional keys take XGLMConfig's defaults."""
    pad = c.get("pad_token_id", 1)
    if pad >= 2:
        raise UnsupportedModelError(
            f"{c.source}: pad_token_id {pad} would zero the sinusoid of position {pad - 2}; "
            "only pad ids 0 and 1 are supported"
        )
    d_model = int(c.req("d_model"))
    n_heads = int(c.req("attention_heads"))
    return dict(
        vocab_size=int(c.req("vocab_size")),
        d_model=d_model,
        n_layers=int(c.req("num_layers")),
        n_heads=n_heads,
        n_kv_heads=n_heads,
        head_dim=d_model // n_heads,
        d_ff=int(c.req("ffn_dim")),
        norm_eps=1e-5,
        context_length=int(c.req("max_position_embeddings")),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        position="sinusoidal",
        position_offset=2,
        embed_scale=math.sqrt(d_model) if c.get("scale_embedding", True) else 1.0,
        attn_bias=True,
        attn_out_bias=True,
        norm="layer",
        ffn="mlp",
        activation=activation_from_hf(c.get("activation_function", "gelu"), c.source),
        mlp_bias=True,
    )


XGLM = Family(
    "XGLM",
    ("xglm",),
    xglm_config,
    renames=(
        # the sinusoid table is computed, not loaded; cross-attention is unused by a causal LM
        (r"^embed_positions\..*$", ""),
        (r"^layers\.\d+\.(encoder_attn|encoder_attn_layer_norm)\..*$", ""),
        (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
        (r"\.self_attn_layer_norm\.", ".input_layernorm."),
        (r"^(layers\.\d+)\.final_layer_norm\.", r"\1.post_attention_layernorm."),
        (r"^layer_norm\.", "norm."),
        (r"\.fc1\.", ".mlp.up_proj."),
        (r"\.fc2\.", ".mlp.down_proj."),
    ),
)
FAMILIES = (XGLM,)
GGUF_ARCHS = ()  # llama.cpp has no XGLM architecture
