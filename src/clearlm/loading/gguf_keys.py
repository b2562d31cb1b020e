"""Which GGUF metadata keys clearlm reads, and the rule that refuses every other one.

A GGUF file describes the computation in its ``{arch}.*`` keys, and llama.cpp's loader
(src/llama-model.cpp, ``load_hparams``; key names in src/llama-arch.cpp, ``LLM_KV_*``) reads
many of them: RoPE scaling, rotary dimensions, windows, soft-caps, experts, extra scales. A key
clearlm skipped would give numbers that differ from llama.cpp's and the original model's with
no sign of it, so the rule is: every key under ``{arch}.`` is

- SIZE: a width or count every architecture has (read by ``config_from_gguf``; a wrong value
  fails the tensor shape check), or
- READ for this architecture (its ``GGUFArch.keys``, declared in its family module next to the
  mapping that reads them; unsupported *values* are refused there, e.g.
  ``rope.scaling.type = "longrope"``), or
- INERT: read by llama.cpp but without effect on what clearlm computes (the reason is listed), or
- NEUTRAL: set to the value that switches its feature off (``expert_count = 0``), or else
- refused with an UnsupportedModelError naming the key.

Outside ``{arch}.``: ``general.*``, ``tokenizer.*`` (the tokenizer's own concern) and
``quantize.*`` (how the file was made) are accepted; ``split.count`` > 1 (a model split over
several files) and any other namespace (a LoRA ``adapter.*``, a vision ``clip.*``, another
architecture's keys) are refused.
"""

from __future__ import annotations

from typing import Any

from clearlm.config import RopeScaling, yarn_mscale
from clearlm.errors import InvalidModelFileError, UnsupportedModelError

# Every architecture: sizes. Lists (one value per layer) are accepted when uniform.
SIZE_KEYS = frozenset(
    {
        "context_length",  # training context: bounds positions, no effect on the numbers
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "vocab_size",
    }
)

# Read by llama.cpp but changing nothing clearlm computes.
INERT_KEYS = {
    "rope.scaling.finetuned": "llama.cpp stores it in hparams.rope_finetuned and never uses it",
}

# Keys accepted only at the value that turns their feature off (llama.cpp's defaults).
NEUTRAL_VALUES: dict[str, Any] = {
    "expert_count": 0,
    "expert_used_count": 0,
    "expert_shared_count": 0,
    "leading_dense_block_count": 0,
    "attention.causal": True,
    "use_parallel_residual": False,
    "pooling_type": 0,
    "logit_scale": 1.0,
    "embedding_scale": 1.0,
    "residual_scale": 1.0,
    "attention.clamp_kqv": 0.0,
    "rope.scaling.attn_factor": 1.0,
}

# What a refused key means, where a hint helps more than the key's name.
REFUSAL_HINTS = {
    "expert_count": "a mixture-of-experts model",
    "expert_used_count": "a mixture-of-experts model",
    "attention.causal": "a non-causal (encoder) model",
    "rope.dimension_sections": "multimodal RoPE (M-RoPE)",
    "attention.sliding_window": "a sliding attention window this architecture's table "
    "does not place",
}

OTHER_NAMESPACES = ("general.", "tokenizer.", "quantize.", "split.")


def refuse(source: str, key: str, value: Any, why: str = "") -> UnsupportedModelError:
    """The one-line error for a key clearlm does not implement (``why``: what it means)."""
    shown = f"a list of {len(value)}" if isinstance(value, list) else repr(value)
    what = f" ({why})" if why else ""
    return UnsupportedModelError(
        f"{source}: metadata key {key!r} = {shown}{what} changes the computation and clearlm "
        "does not implement it; run this file with llama.cpp instead"
    )


def check_keys(metadata: dict[str, Any], arch: str, read: frozenset[str], source: str) -> None:
    """Refuse the first key the module docstring's rule does not accept.

    Args:
        metadata: the file's key → value.
        arch: ``general.architecture``.
        read: the keys (after ``{arch}.``) this architecture's builder reads.

    Raises:
        UnsupportedModelError: naming the key.
    """
    prefix = f"{arch}."
    for key, value in metadata.items():
        if not key.startswith(prefix):
            if key == "split.count" and int(value) > 1:
                raise UnsupportedModelError(
                    f"{source}: metadata key 'split.count' = {value}: the model is split over "
                    "several files; merge them with llama.cpp's gguf-split --merge"
                )
            if not key.startswith(OTHER_NAMESPACES):
                raise refuse(source, key, value, "not a key of this architecture")
            continue
        name = key[len(prefix) :]
        if name in SIZE_KEYS or name in read or name in INERT_KEYS:
            continue
        if name in NEUTRAL_VALUES and value == NEUTRAL_VALUES[name]:
            continue
        raise refuse(source, key, value, REFUSAL_HINTS.get(name, ""))


def uniform(value: Any, key: str, source: str) -> Any:
    """A per-layer list with one distinct value → that value; other lists are refused."""
    if not isinstance(value, list):
        return value
    if len(set(value)) != 1:
        raise refuse(source, key, value, "different values per layer")
    return value[0]


def rope_from_gguf(
    m: dict[str, Any], arch: str, source: str, freq_factors: tuple[float, ...] | None
) -> RopeScaling | None:
    """The RoPE scaling of a GGUF file, as llama.cpp's load_hparams reads it.

    llama.cpp: ``rope.scaling.type`` defaults to "linear"; the factor comes from
    ``rope.scaling.factor`` or, in older files, ``rope.scale_linear``; 0 or 1 mean no scaling,
    and type "none" ignores the factor. "yarn" also reads ``original_context_length`` (default:
    the training context) and ``yarn_beta_fast``/``yarn_beta_slow`` (32, 1), and scales cos/sin
    by 0.1·ln(factor) + 1 (ggml's rope_yarn mscale); its ``yarn_ext_factor``,
    ``yarn_attn_factor`` and ``yarn_log_multiplier`` are not read, so a file with one is
    refused. A ``rope_freqs.weight`` tensor (``freq_factors``, d/2 values) divides each
    frequency on its own; its converter writes it in place of Llama 3's rope_scaling, so a file
    with both is refused.

    Raises:
        UnsupportedModelError: a scaling type other than none/linear/yarn (longrope).
    """
    kind = m.get(f"{arch}.rope.scaling.type", "linear")
    factor_key = f"{arch}.rope.scaling.factor"
    if factor_key not in m:
        factor_key = f"{arch}.rope.scale_linear"
    factor = float(m.get(factor_key, 0.0))
    if kind not in ("none", "linear", "yarn"):
        raise refuse(source, f"{arch}.rope.scaling.type", kind, "supported: none, linear, yarn")
    if kind == "yarn" and factor not in (0.0, 1.0):
        if freq_factors is not None:
            raise refuse(source, factor_key, factor, "together with a rope_freqs tensor")
        pre = f"{arch}.rope.scaling."
        return RopeScaling(
            "yarn",
            factor,
            original_context=int(
                m.get(pre + "original_context_length", m[f"{arch}.context_length"])
            ),
            beta_fast=float(m.get(pre + "yarn_beta_fast", 32.0)),
            beta_slow=float(m.get(pre + "yarn_beta_slow", 1.0)),
            attention_factor=yarn_mscale(factor),
        )
    linear = kind == "linear" and factor not in (0.0, 1.0)
    if freq_factors is not None:
        if linear:
            raise refuse(source, factor_key, factor, "together with a rope_freqs tensor")
        return RopeScaling("factors", 1.0, freq_factors=freq_factors)
    return RopeScaling("linear", factor) if linear else None


def check_head_lengths(m: dict[str, Any], arch: str, head_dim: int, source: str) -> None:
    """Values as wide as keys (``attention.value_length`` = ``key_length``), as our attention
    assumes; llama.cpp allows them to differ (DeepSeek's MLA)."""
    key = f"{arch}.attention.value_length"
    if key in m and int(m[key]) != head_dim:
        raise refuse(source, key, m[key], f"differs from the key length {head_dim}")


def check_freq_factors(factors: tuple[float, ...], rope_dim: int, source: str) -> None:
    """rope_freqs.weight holds one factor per rotated pair: (rope_dim / 2,)."""
    if len(factors) != rope_dim // 2:
        raise InvalidModelFileError(
            f"{source}: tensor rope_freqs.weight has {len(factors)} values, expected "
            f"{rope_dim // 2} (one per rotated pair)"
        )
