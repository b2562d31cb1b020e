"""Type and range checks on a model file's configuration values, before any is used.

A corrupt or hand-edited file can say ``head_count = 0``, ``block_count = "two"``,
``rms_norm_eps = -1`` or ``rope_theta = NaN``. Each such value would otherwise surface later as
a ZeroDivisionError, a ValueError from ``int()``, or NaN logits at generation time. Here every
known size, count, ε and RoPE value is checked where the file is read, and refused with an
InvalidModelFileError naming the file and the key. ``config_errors`` wraps the rest of the
config building so that any remaining Python error becomes the same typed error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from clearlm.errors import ClearLMError, InvalidModelFileError

# Sizes and counts: positive integers. GGUF keys are after the ``{arch}.`` prefix.
GGUF_POSITIVE_INTS = (
    "context_length",
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "vocab_size",
    "rope.dimension_count",
    "rope.scaling.original_context_length",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
)
GGUF_NON_NEGATIVE_INTS = ("attention.sliding_window", "expert_count", "expert_used_count")
# Floats that must be finite and > 0.
GGUF_POSITIVE_FLOATS = (
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.factor",
    "rope.scale_linear",
)

HF_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "n_embd",
    "n_head",
    "n_layer",
    "n_layers",
    "num_layers",
    "n_positions",
    "n_inner",
    "ffn_dim",
    "d_model",
    "attention_heads",
    "word_embed_proj_dim",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "decoder_sparse_step",
)
HF_NON_NEGATIVE_INTS = (
    "sliding_window",
    "max_window_layers",
    "num_experts",
    "shared_expert_intermediate_size",
)
HF_POSITIVE_FLOATS = (
    "rms_norm_eps",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "rope_theta",
    "rope_local_base_freq",
    "clip_qkv",
)
HF_ROPE_FLOATS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor")


def bad_value(source: str, key: str, value: Any, want: str) -> InvalidModelFileError:
    """The error for one bad value: file, key, value (shortened) and what it must be."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return InvalidModelFileError(
        f"{source}: {key} = {shown} is invalid: it must be {want}; the file is corrupt "
        "or was edited by hand"
    )


def check_int(value: Any, key: str, source: str, minimum: int = 1) -> None:
    """Raise unless value (or each entry of a per-layer list) is an int ≥ minimum."""
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise bad_value(source, key, value, want)


def check_float(value: Any, key: str, source: str) -> None:
    """Raise unless value (or each list entry) is a finite number > 0."""
    for v in value if isinstance(value, list) else [value]:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok or not math.isfinite(v) or v <= 0:
            raise bad_value(source, key, value, "a finite number > 0")


def check_gguf_values(metadata: dict[str, Any], arch: str, source: str) -> None:
    """Check every known ``{arch}.*`` size, count, ε and RoPE value of a GGUF file."""
    for names, check in (
        (GGUF_POSITIVE_INTS, lambda v, k: check_int(v, k, source)),
        (GGUF_NON_NEGATIVE_INTS, lambda v, k: check_int(v, k, source, 0)),
        (GGUF_POSITIVE_FLOATS, lambda v, k: check_float(v, k, source)),
    ):
        for name in names:
            key = f"{arch}.{name}"
            if key in metadata:
                check(metadata[key], key)


def check_hf_values(raw: Any, source: str) -> None:
    """Check that config.json is an object and its known sizes, ε and RoPE values are sane.

    None (JSON null) means absent, as transformers reads it."""
    if not isinstance(raw, dict):
        raise InvalidModelFileError(
            f"{source} holds a JSON {type(raw).__name__}, not an object; "
            "a Hugging Face config.json is a {...} object"
        )
    for key in HF_POSITIVE_INTS + HF_NON_NEGATIVE_INTS:
        if raw.get(key) is not None:
            check_int(raw[key], key, source, 0 if key in HF_NON_NEGATIVE_INTS else 1)
    for key in HF_POSITIVE_FLOATS:
        if raw.get(key) is not None:
            check_float(raw[key], key, source)
    for key in ("rope_parameters", "rope_scaling"):
        params = raw.get(key)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise bad_value(source, key, params, 'an object such as {"rope_type": ...}')
        nested = params.values() if all(isinstance(v, dict) for v in params.values()) else []
        for group in [params, *nested]:  # Gemma 3 nests one dict per attention kind
            for name in HF_ROPE_FLOATS:
                if group.get(name) is not None:
                    check_float(group[name], f"{key}.{name}", source)


@contextmanager
def config_errors(source: str) -> Iterator[None]:
    """Turn a Python error raised while mapping a file's values into an InvalidModelFileError
    naming the file (the values the checks above do not cover: family-specific keys)."""
    try:
        yield
    except InvalidModelFileError as e:
        if str(e).startswith(source):
            raise
        raise InvalidModelFileError(f"{source}: {e}") from None
    except ClearLMError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError, OverflowError) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
        raise InvalidModelFileError(
            f"{source}: a configuration value is invalid ({what}); the file is "
            "corrupt or was edited by hand"
        ) from None
