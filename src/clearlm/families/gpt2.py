"""GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners").

What differs from the shared (Llama-default) layers, read from transformers'
``models/gpt2/modeling_gpt2.py`` and OpenAI's ``gpt-2/src/model.py``:

- stage 1: a learned absolute position table ``wpe`` added to the token embedding ``wte``;
- stage 2: one fused projection ``c_attn`` produces Q, K and V (split here into q/k/v_proj),
  every projection has a bias, scores scaled by 1/√Hd (or 1 when ``scale_attn_weights`` is off);
- stage 3: pre-norm blocks with LayerNorm (γ and β, ε = ``layer_norm_epsilon``), a plain MLP
  ``c_fc`` → GELU (tanh approximation, "gelu_new") → ``c_proj``, d_ff = ``n_inner`` or 4·D;
- stage 4: a final LayerNorm ``ln_f`` and an output projection tied to ``wte``.

GPT-2's linear layers are ``Conv1D`` modules (a TensorFlow leftover) that store weights as
(in, out) and compute x·W + b; ``nn.Linear`` stores (out, in), so each one is transposed at load.
The ``attn.bias``/``attn.masked_bias`` entries of old checkpoints are the causal-mask buffers,
not parameters, and are dropped. llama.cpp exports GPT-2 as GGUF architecture "gpt2" (GPT2_TENSORS
below), with the fused ``attn_qkv`` already in (out, in) layout.
"""

from __future__ import annotations

from typing import Any

from clearlm.config import ModelConfig
from clearlm.errors import UnsupportedModelError
from clearlm.families.base import HEAD_KEYS, Family, GGUFArch, HFConfig, activation_from_hf
from clearlm.families.transforms import StateDict, split_qkv

# Our names of the modules GPT-2 builds as Conv1D (weights stored (in, out)).
CONV1D = (
    "self_attn.qkv_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)


# GPT-2's choices at each stage, whichever format the checkpoint comes in.
GPT2_LAYERS: dict[str, Any] = dict(
    position="learned", attn_bias=True, attn_out_bias=True, norm="layer", ffn="mlp", mlp_bias=True
)


def gpt2_config(c: HFConfig) -> dict[str, Any]:
    """config.json → ModelConfig fields. GPT-2 files use their own key names (n_embd, n_layer,
    n_head, n_positions); absent optional keys take GPT2Config's defaults."""
    if c.get("scale_attn_by_inverse_layer_idx", False):
        raise UnsupportedModelError(
            f"{c.source}: scale_attn_by_inverse_layer_idx (a per-layer attention scale) "
            "is not supported"
        )
    d_model = int(c.req("n_embd"))
    n_heads = int(c.req("n_head"))
    return dict(
        vocab_size=int(c.req("vocab_size")),
        d_model=d_model,
        n_layers=int(c.req("n_layer")),
        n_heads=n_heads,
        n_kv_heads=n_heads,
        head_dim=d_model // n_heads,
        d_ff=int(c.get("n_inner", 4 * d_model)),
        norm_eps=float(c.get("layer_norm_epsilon", 1e-5)),
        context_length=int(c.req("n_positions")),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        **GPT2_LAYERS,
        attn_scale=None if c.get("scale_attn_weights", True) else 1.0,
        activation=activation_from_hf(c.get("activation_function", "gelu_new"), c.source),
    )


def gpt2_convert(state: StateDict, config: ModelConfig) -> StateDict:
    """Transpose the Conv1D weights from (in, out) to nn.Linear's (out, in), then split QKV."""
    state = {
        k: v.t().contiguous() if k.endswith(CONV1D) and v.ndim == 2 else v for k, v in state.items()
    }
    return split_qkv(state, config)


GPT2 = Family(
    "GPT-2",
    ("gpt2",),
    gpt2_config,
    renames=(
        # causal-mask buffers of old checkpoints; cross-attention, unused by a causal LM
        (r"^h\.\d+\.attn\.(masked_)?bias$", ""),
        (r"^h\.\d+\.(crossattention|ln_cross_attn)\..*$", ""),
        (r"^wte\.", "embed_tokens."),
        (r"^wpe\.", "embed_positions."),
        (r"^h\.(\d+)\.ln_1\.", r"layers.\1.input_layernorm."),
        (r"^h\.(\d+)\.ln_2\.", r"layers.\1.post_attention_layernorm."),
        (r"^h\.(\d+)\.attn\.c_attn\.", r"layers.\1.self_attn.qkv_proj."),
        (r"^h\.(\d+)\.attn\.c_proj\.", r"layers.\1.self_attn.o_proj."),
        (r"^h\.(\d+)\.mlp\.c_fc\.", r"layers.\1.mlp.up_proj."),
        (r"^h\.(\d+)\.mlp\.c_proj\.", r"layers.\1.mlp.down_proj."),
        (r"^ln_f\.", "norm."),
    ),
    convert=gpt2_convert,
    # GPT2LMHeadModel saves "transformer.h.0..."; OpenAI's hub files (GPT2Model) have no prefix.
    prefixes=("transformer.",),
)
FAMILIES = (GPT2,)

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

GGUF_ARCHS = (
    GGUFArch(
        "gpt2",
        GPT2_TENSORS,
        family="GPT-2",
        # llama.cpp's GPT-2 graph always runs GELU (tanh), "gelu_new".
        config=lambda m, a: dict(GPT2_LAYERS, activation="gelu_tanh"),
        norm_eps_key="attention.layer_norm_epsilon",
        convert=split_qkv,
        keys=HEAD_KEYS,  # learned positions: a rope.* key is refused
    ),
)
