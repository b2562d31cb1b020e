"""The whole decoder: token embedding → N blocks → final norm → output projection → logits."""

from __future__ import annotations

import torch
from torch import nn

from clearlm.config import ModelConfig
from clearlm.errors import ContextLengthError
from clearlm.kv_cache import KVCache
from clearlm.model.layers import Block, RMSNorm, RotaryEmbedding


class Transformer(nn.Module):
    """A decoder-only Transformer (Llama family) that keeps no hidden state between calls.

    Parameter names follow Hugging Face's Llama (without its ``model.`` prefix):
    ``embed_tokens``, ``layers.{i}.self_attn.q_proj``, ``layers.{i}.mlp.gate_proj``, ``norm``,
    ``lm_head``. With ``tie_word_embeddings`` the output projection is the embedding matrix.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.rope = RotaryEmbedding(config.rope_dim, config.rope_theta, config.context_length)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Run the stack on new tokens.

        Args:
            tokens: (B, T) int64 token ids.
            positions: (T,) int64 positions of the new tokens (shared by the batch); default
                0 … T-1. With a cache they must continue from ``cache.length``.
            cache: keys/values of earlier positions; updated in place with the new ones.
            last_only: project only the last position to logits (what generation needs;
                saves a (T-1) × D × V matmul).

        Returns:
            logits (B, T, V) float, or (B, 1, V) with last_only.

        Raises:
            ContextLengthError: positions run past the RoPE table or the cache.
        """
        T = tokens.shape[1]
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + T, device=tokens.device)
        if int(positions[-1]) >= self.config.context_length:
            raise ContextLengthError(
                f"position {int(positions[-1])} is past the model's context length "
                f"({self.config.context_length} tokens)"
            )
        cos, sin = self.rope(positions)  # (T, Hd) each
        x = self.embed_tokens(tokens)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, cos, sin, positions, cache)
        if cache is not None:
            cache.length = int(positions[-1]) + 1
        if last_only:
            x = x[:, -1:, :]  # (B, 1, D)
        return self.lm_head(self.norm(x))  # (B, T, V)
