"""Gemma (Gemma Team 2024), Gemma 2 (Gemma Team 2024b) and Gemma 3 (Gemma Team 2025): the shared
layers with Gemma's choices, read from transformers' ``models/{gemma,gemma2,gemma3}/modeling_*.py``
and ``configuration_*.py`` (v5).

- All three: the token embedding is multiplied by √D (``normalizer``; transformers rounds it to
  the activations' dtype first, so do we: ``Transformer.embed``); every RMSNorm scales by 1 + w
  (checkpoints store w - 1; computed in float32 before the cast back); GeGLU feed-forward
  (GELU, tanh approximation); the output projection is tied to the embedding by default.
- Gemma 2: + "sandwich" blocks (a norm before *and* after each sublayer); attention scores
  scaled by query_pre_attn_scalar^-1/2 instead of Hd^-1/2; tanh soft-capping of the attention
  scores (attn_logit_softcapping) and of the final logits (final_logit_softcapping); layers
  alternate between a sliding window (even layers) and global attention (``layer_types``).
- Gemma 3: Gemma 2 without attention soft-capping (transformers' Gemma3Attention never passes
  it on, and llama.cpp's converter asserts it is unset), + RMSNorm on each head's q and k; five
  sliding layers per global one (``sliding_window_pattern`` 6, or explicit ``layer_types``);
  global and sliding layers have their own RoPE base (``rope_parameters`` per layer type, or the
  older ``rope_theta`` / ``rope_local_base_freq``), and a linear RoPE scaling applies to the
  global layers only (Gemma 3 4B and up).

A sliding layer at position p sees keys at positions p - W < s ≤ p (transformers'
``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``), the same rule as Mistral's.

The multimodal ``gemma3`` config (Gemma3ForConditionalGeneration: a SigLIP vision tower plus a
language model whose nested ``text_config`` lists only the values that differ from
Gemma3TextConfig's defaults) is not read: clearlm would have to copy transformers' defaults. Its
GGUF (architecture "gemma3") holds the text backbone only and loads.
"""

from __future__ import annotations

from typing import Any

from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.families.base import (
    COMMON_TENSORS,
    HEAD_KEYS,
    QK_NORMS,
    ROPE_KEYS,
    Family,
    GGUFArch,
    HFConfig,
    activation_from_hf,
    decoder_core,
    rope_from_hf,
)

# transformers' layer_types names → ours.
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}


def _value(c: HFConfig, key: str, default: Any) -> Any:
    """The key's value where present, even null (null turns a soft-cap off); else the default
    of transformers' config class (a key that is absent takes the class default)."""
    return c.data[key] if key in c.data else default


def _activation(c: HFConfig, key: str) -> str:
    name = c.get(key, "gelu_pytorch_tanh")
    if name == "gelu" and key == "hidden_act":
        # Gemma's first checkpoints say "gelu" but were trained with the tanh approximation;
        # transformers' GemmaConfig rewrites it to gelu_pytorch_tanh (PR #29402).
        return "gelu_tanh"
    return activation_from_hf(name, c.source)


def _check_causal(c: HFConfig) -> None:
    if c.get("use_bidirectional_attention", False):
        raise UnsupportedModelError(
            f"{c.source}: use_bidirectional_attention (EmbeddingGemma, an encoder) is not "
            "supported; clearlm runs causal language models"
        )


def gemma_config(c: HFConfig) -> dict[str, Any]:
    """Gemma (1): Llama's pre-norm block with the three changes every Gemma shares."""
    _check_causal(c)
    cfg = decoder_core(c)
    bias = bool(c.get("attention_bias", False))
    cfg.update(
        rope_from_hf(c),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),  # GemmaConfig's default
        embed_scale=cfg["d_model"] ** 0.5,
        norm_offset=1.0,
        activation=_activation(c, "hidden_act"),
        attn_bias=bias,
        attn_out_bias=bias,
    )
    return cfg


def layer_types_from_hf(c: HFConfig, n_layers: int, pattern: int) -> tuple[str, ...]:
    """Per-layer "sliding"/"full" from ``layer_types``, or else every ``pattern``-th layer
    global and the rest sliding (transformers: sliding iff (i + 1) % pattern != 0)."""
    names = c.get("layer_types")
    if names is None:
        return tuple("sliding" if (i + 1) % pattern else "full" for i in range(n_layers))
    unknown = sorted(set(names) - set(LAYER_TYPES))
    if unknown:
        raise UnsupportedModelError(
            f"{c.source}: layer type {unknown[0]!r} is not supported; supported: "
            + ", ".join(LAYER_TYPES)
        )
    if len(names) != n_layers:
        raise InvalidModelFileError(
            f"{c.source}: layer_types has {len(names)} entries for {n_layers} layers"
        )
    return tuple(LAYER_TYPES[n] for n in names)


def gemma2_config(c: HFConfig) -> dict[str, Any]:
    """Gemma 2: sandwich norms, query_pre_attn_scalar, soft-caps, alternating local/global."""
    cfg = dict(gemma_config(c), activation=_activation(c, "hidden_activation"))
    cfg.update(
        block="sandwich",
        attn_scale=float(_value(c, "query_pre_attn_scalar", 256)) ** -0.5,
        attn_softcap=_value(c, "attn_logit_softcapping", 50.0),
        final_logit_softcap=_value(c, "final_logit_softcapping", 30.0),
        sliding_window=int(c.get("sliding_window", 4096)),
        layer_types=layer_types_from_hf(c, cfg["n_layers"], 2),
    )
    return cfg


def gemma3_rope(c: HFConfig) -> dict[str, Any]:
    """RoPE of global layers (base, scaling) and of sliding layers (base only).

    transformers ≥ 5 writes ``rope_parameters`` = {"full_attention": {...}, "sliding_attention":
    {...}}; older files have ``rope_theta`` (global, default 1e6), ``rope_local_base_freq``
    (sliding, default 1e4) and a ``rope_scaling`` that applies to global layers only
    (Gemma3TextConfig.convert_rope_params_to_dict).
    """
    params = c.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or ({} if "sliding_attention" in params else params))
    full.setdefault("rope_theta", c.get("rope_theta", 1_000_000.0))
    local = dict(params.get("sliding_attention") or {})
    local.setdefault("rope_theta", c.get("rope_local_base_freq", 10_000.0))
    if local.get("rope_type", "default") != "default":
        raise UnsupportedModelError(
            f"{c.source}: RoPE scaling {local['rope_type']!r} on sliding layers is not supported"
        )
    return dict(rope_from_hf(c, full), rope_local_theta=float(local["rope_theta"]))


def gemma3_config(c: HFConfig) -> dict[str, Any]:
    """Gemma 3: Gemma 2 + q/k norm, 5:1 local/global, per-type RoPE, no attention soft-cap."""
    cfg = gemma2_config(c)
    pattern = int(c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6)))
    cfg.update(
        gemma3_rope(c),
        qk_norm=True,
        attn_softcap=None,
        final_logit_softcap=_value(c, "final_logit_softcapping", None),
        layer_types=layer_types_from_hf(c, cfg["n_layers"], pattern),
    )
    return cfg


# --- GGUF: llama.cpp's converter (convert_hf_to_gguf.py, Gemma*Model) and loader
# (llama-model.cpp, LLM_ARCH_GEMMA*) fix what config.json would say; every norm weight is stored
# as 1 + w (norm_shift: loading.transforms.unshift_norm takes the 1 back off, as transformers'
# Gemma2TensorProcessor does).


def _gguf_attn_scale(m: dict[str, Any], a: str, n_layers_27b: int) -> float | None:
    """llama.cpp: 1/√(D/H) for the 27B models (query_pre_attn_scalar = D/H there), else
    1/√Hd (None: our default). The file does not store query_pre_attn_scalar."""
    if int(m[f"{a}.block_count"]) != n_layers_27b:
        return None
    return (int(m[f"{a}.embedding_length"]) / int(m[f"{a}.attention.head_count"])) ** -0.5


def _gguf_layer_types(m: dict[str, Any], a: str, default_pattern: int) -> tuple[str, ...]:
    """``{arch}.attention.sliding_window_pattern``: a period n (every n-th layer global) or one
    bool per layer (True: sliding); absent means llama.cpp's fixed period for the architecture
    (Gemma 2: 2, Gemma 3: 6), which is also what transformers' GGUF loader assumes."""
    n_layers = int(m[f"{a}.block_count"])
    pattern = m.get(f"{a}.attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise InvalidModelFileError(
                f"{a}.attention.sliding_window_pattern has {len(pattern)} entries for "
                f"{n_layers} layers"
            )
        return tuple("sliding" if s else "full" for s in pattern)
    n = int(pattern)  # llama.cpp set_swa_pattern: 0 → all sliding, 1 → none
    return tuple("sliding" if n == 0 or (i + 1) % n else "full" for i in range(n_layers))


def gemma_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "gemma": √D embedding scale, (1 + w) norms, GeGLU."""
    return dict(
        embed_scale=int(m[f"{a}.embedding_length"]) ** 0.5,
        norm_offset=1.0,
        activation="gelu_tanh",
    )


def gemma2_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "gemma2": soft-caps and window with llama.cpp's defaults (50, 30, 4096)."""
    return dict(
        gemma_gguf_config(m, a),
        block="sandwich",
        attn_scale=_gguf_attn_scale(m, a, 46),
        attn_softcap=float(m.get(f"{a}.attn_logit_softcapping", 50.0)),
        final_logit_softcap=float(m.get(f"{a}.final_logit_softcapping", 30.0)),
        sliding_window=int(m.get(f"{a}.attention.sliding_window", 4096)),
        layer_types=_gguf_layer_types(m, a, 2),
    )


def gemma3_gguf_config(m: dict[str, Any], a: str) -> dict[str, Any]:
    """GGUF "gemma3": ``rope.freq_base`` is the global layers' base; sliding layers use
    ``rope.freq_base_swa`` or 10 000 (llama.cpp), and the linear ``rope.scaling`` that
    config_from_gguf reads applies to global layers only (the Transformer gives sliding layers
    an unscaled RoPE). No sliding window in the file (or 0) means every layer is global."""
    window = int(m.get(f"{a}.attention.sliding_window", 0))
    cap = m.get(f"{a}.final_logit_softcapping")
    return dict(
        gemma_gguf_config(m, a),
        block="sandwich",
        qk_norm=True,
        attn_scale=_gguf_attn_scale(m, a, 62),
        final_logit_softcap=float(cap) if cap else None,
        sliding_window=window or None,
        layer_types=_gguf_layer_types(m, a, 6) if window else (),
        rope_local_theta=float(m.get(f"{a}.rope.freq_base_swa", 10_000.0)),
    )


GEMMA = Family("Gemma", ("gemma",), gemma_config)
GEMMA2 = Family("Gemma 2", ("gemma2",), gemma2_config)
GEMMA3 = Family("Gemma 3", ("gemma3_text",), gemma3_config)
FAMILIES = (GEMMA, GEMMA2, GEMMA3)

# Gemma 2/3 (Gemma2Model/Gemma3Model): four norms per block. llama.cpp calls the pre-FFN norm
# ffn_norm, which for Llama-style blocks is the post-attention norm.
GEMMA2_TENSORS = COMMON_TENSORS | {
    "blk.{i}.post_attention_norm.weight": "layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.post_ffw_norm.weight": "layers.{i}.post_feedforward_layernorm.weight",
}
SOFTCAPS = frozenset({"attn_logit_softcapping", "final_logit_softcapping"})
WINDOW_KEYS = frozenset({"attention.sliding_window", "attention.sliding_window_pattern"})

# Q/K rows are not permuted; every norm weight is stored as 1 + w (norm_shift).
GGUF_ARCHS = (
    GGUFArch("gemma", COMMON_TENSORS, family="Gemma", config=gemma_gguf_config, norm_shift=1.0),
    GGUFArch(
        "gemma2",
        GEMMA2_TENSORS,
        family="Gemma 2",
        config=gemma2_gguf_config,
        norm_shift=1.0,
        keys=ROPE_KEYS | HEAD_KEYS | SOFTCAPS | WINDOW_KEYS,
    ),
    GGUFArch(
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
)
