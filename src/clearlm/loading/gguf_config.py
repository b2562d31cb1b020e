"""ModelConfig from a GGUF file's metadata: the sizes and RoPE every architecture has, then
the fields its family adds (``GGUFArch.config`` in ``clearlm.families.<name>``).

Every ``{arch}.*`` key is read, inert, neutral or refused (loading/gguf_keys.py); the keys an
architecture reads are declared with it (``GGUFArch.keys``).
"""

from __future__ import annotations

from typing import Any

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.families import gguf_arch
from clearlm.loading.config_values import check_gguf_values, config_errors
from clearlm.loading.gguf_keys import (
    check_freq_factors,
    check_head_lengths,
    check_keys,
    refuse,
    rope_from_gguf,
    uniform,
)


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
    check_gguf_values(metadata, arch_name, source)
    with config_errors(source):
        return _config(metadata, tensor_names, source, rope_freqs, arch_name, arch)


def _config(
    metadata: dict[str, Any],
    tensor_names: set[str],
    source: str,
    rope_freqs: tuple[float, ...] | None,
    arch_name: str,
    arch: Any,
) -> ModelConfig:

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
    key_length = f"{arch_name}.attention.key_length"
    if key_length not in metadata and d_model % n_heads:
        raise InvalidModelFileError(
            f"{source}: {arch_name}.embedding_length ({d_model}) is not a multiple of "
            f"{arch_name}.attention.head_count ({n_heads}) and {key_length} is absent"
        )
    head_dim = int(metadata.get(key_length, d_model // n_heads))
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
