"""A preallocated key/value cache: one fixed-size buffer pair per layer, and its offset.

Autoregressive decoding recomputes nothing for past tokens: each layer stores the keys and values
it computed for every position so far, and a new token only attends to them. Buffers are
allocated once at their maximum size (gpt-fast's static cache), so decoding never reallocates.

The cache owns its position (mlx-lm's ``cache.offset``): ``offset`` is how many positions are
filled. During one forward pass over T new tokens every layer calls
``update_and_fetch(layer, k, v)``, which writes at [offset, offset + T) and returns the keys and
values up to offset + T; the offset stays put, so all layers write at the same place. When the
last block has written, the model calls ``advance(T)``. A pass that raises before then leaves
the offset where it was, so the same tokens can be run again.
"""

from __future__ import annotations

import torch

from clearlm.errors import ContextLengthError


class KVCache:
    """Per-layer key/value buffers of shape (B, K, S_max, Hd), filled up to ``offset``.

    Letters: B batch, K n_kv_heads, S_max max_seq_len (tokens), Hd head_dim, T new tokens.

    Args:
        n_layers: number of Transformer blocks (one buffer pair each).
        batch_size: B.
        n_kv_heads: K.
        head_dim: Hd.
        max_seq_len: S_max, the most positions the cache can hold (tokens).
        dtype: dtype of the stored keys/values (the model's compute dtype).
        device: where the buffers live.

    Memory: 2 · n_layers · B · K · S_max · Hd · itemsize bytes (SmolLM2-135M, fp32, 8192
    positions: 2·30·1·3·8192·64·4 = 377 MB; generation sizes the cache to what it needs).
    """

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (batch_size, n_kv_heads, max_seq_len, head_dim)  # (B, K, S_max, Hd)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_seq_len = max_seq_len
        self.offset = 0  # positions filled so far (tokens); moved only by advance()

    def update_and_fetch(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write T new keys/values at positions [offset, offset + T); return all keys so far.

        Args:
            layer: block index.
            k, v: (B, K, T, Hd) new keys and values.

        Returns:
            (keys, values), each (B, K, offset + T, Hd): views into the buffers, no copy.

        Raises:
            ContextLengthError: offset + T exceeds max_seq_len.
        """
        start = self.offset
        end = start + k.shape[2]
        if end > self.max_seq_len:
            raise ContextLengthError(
                f"KV cache holds {self.max_seq_len} positions; cannot write up to position {end}"
            )
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n: int) -> None:
        """Count n more positions as filled, once every layer has written them (tokens)."""
        self.offset += n
