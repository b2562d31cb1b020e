"""The model's hyper-parameters as one frozen dataclass, built key by key from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clearlm.errors import InvalidModelFileError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("llama",)


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only Transformer (names follow the field's usage).

    Attributes:
        architecture: family name as GGUF's ``general.architecture`` gives it (e.g. ``"llama"``).
        vocab_size: V, number of token ids (rows of the embedding matrix).
        d_model: D, width of the residual stream.
        n_layers: N, number of Transformer blocks.
        n_heads: H, query heads per attention layer.
        n_kv_heads: K, key/value heads (grouped-query attention when K < H).
        head_dim: Hd, width of one head (usually D / H).
        d_ff: F, hidden width of the feed-forward network.
        norm_eps: epsilon inside RMSNorm's square root.
        rope_theta: RoPE base frequency (Su et al. 2021, "RoFormer").
        context_length: the longest sequence (tokens) the model was trained for.
        tie_word_embeddings: True when the output projection reuses the embedding matrix.
        rope_dim: how many of each head's dimensions RoPE rotates (== head_dim for Llama).
    """

    architecture: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    norm_eps: float
    rope_theta: float
    context_length: int
    tie_word_embeddings: bool
    rope_dim: int = field(default=0)

    def __post_init__(self) -> None:
        if self.rope_dim == 0:
            object.__setattr__(self, "rope_dim", self.head_dim)
        if self.n_heads % self.n_kv_heads != 0:
            raise InvalidModelFileError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )

    @classmethod
    def from_gguf(
        cls, metadata: dict[str, Any], tensor_names: set[str], source: str = "GGUF file"
    ) -> ModelConfig:
        """Build the config from GGUF metadata (``{arch}.*`` keys, see the GGUF spec).

        Args:
            metadata: key → value, as :func:`clearlm.loading.gguf.read_metadata` returns it.
            tensor_names: the file's tensor names; a missing ``output.weight`` means a tied head.
            source: the file's name, used in error messages.

        Raises:
            UnsupportedModelError: ``general.architecture`` is not one clearlm runs.
            InvalidModelFileError: a required key is missing.
        """
        arch = metadata.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: architecture {arch!r} is not supported; supported: "
                + ", ".join(SUPPORTED_ARCHITECTURES)
            )

        def req(key: str) -> Any:
            full = f"{arch}.{key}"
            if full not in metadata:
                raise InvalidModelFileError(f"{source}: required metadata key {full!r} is missing")
            return metadata[full]

        d_model = int(req("embedding_length"))
        n_heads = int(req("attention.head_count"))
        # head_count_kv is optional in the GGUF spec: absent means plain multi-head attention.
        n_kv_heads = int(metadata.get(f"{arch}.attention.head_count_kv", n_heads))
        head_dim = int(metadata.get(f"{arch}.attention.key_length", d_model // n_heads))
        if "tokenizer.ggml.tokens" in metadata:
            vocab_size = len(metadata["tokenizer.ggml.tokens"])
        else:
            vocab_size = int(req("vocab_size"))
        return cls(
            architecture=arch,
            vocab_size=vocab_size,
            d_model=d_model,
            n_layers=int(req("block_count")),
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            d_ff=int(req("feed_forward_length")),
            norm_eps=float(req("attention.layer_norm_rms_epsilon")),
            rope_theta=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            context_length=int(req("context_length")),
            tie_word_embeddings="output.weight" not in tensor_names,
            rope_dim=int(metadata.get(f"{arch}.rope.dimension_count", head_dim)),
        )
