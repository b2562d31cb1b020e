"""A preallocated, slot-based key/value cache: fixed-size buffers per layer and per-slot lengths.

Autoregressive decoding recomputes nothing for past tokens: each layer stores the keys and values
it computed for every position so far, and a new token only attends to them. Buffers are
allocated once at their maximum size (gpt-fast's static cache), so decoding never reallocates.

The cache holds ``n_slots`` independent sequences (slots), as vLLM's and llama.cpp's servers do:
a sequence takes a free slot, and its keys sit at row ``slot``, column ``position``. Each slot has
its own filled length (``lengths``, a tensor), so sequences of different lengths share one batch
without padding their prompts: every row of a batch carries its own positions ("per-row
offsets", rather than left padding; see :class:`CacheRows`).

Nothing here reads a tensor back to Python: a forward pass writes by position tensor
(``index_put_`` at (slot, position), done in place in a compiled step too) and moves
``lengths`` with tensor ops, so a compiled decode step never synchronises with the host.
``lengths`` moves only after the last block has written (:meth:`CacheRows.advance`), so a pass
that raises half-way leaves the lengths where they were and the same tokens can be run again.
"""

from __future__ import annotations

import torch

from clearlm.errors import ContextLengthError


class KVCache:
    """Per-layer key/value buffers of shape (n_slots, K, S_max + 1, Hd) and per-slot lengths.

    Letters: K n_kv_heads, S_max max_seq_len (tokens), Hd head_dim, B batch rows, T new tokens.
    Column S_max is scratch: padding tokens (position −1) write there and nobody reads it.

    Args:
        n_layers: number of Transformer blocks (one buffer pair each).
        n_slots: how many sequences the cache holds at once.
        n_kv_heads: K.
        head_dim: Hd.
        max_seq_len: S_max, the most positions one slot can hold (tokens).
        dtype: dtype of the stored keys/values (the model's compute dtype).
        device: where the buffers live.

    Memory: 2 · n_layers · n_slots · K · (S_max + 1) · Hd · itemsize bytes (SmolLM2-135M, fp32,
    one slot of 8192 positions: 2·30·3·8193·64·4 ≈ 377 MB; generation sizes the cache to what
    it needs).
    """

    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        n_kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_slots, n_kv_heads, max_seq_len + 1, head_dim)  # (n_slots, K, S_max + 1, Hd)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.n_slots = n_slots
        self.max_seq_len = max_seq_len
        self.lengths = torch.zeros(n_slots, dtype=torch.long, device=device)  # filled, per slot

    @classmethod
    def from_buffers(
        cls, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: torch.Tensor
    ) -> KVCache:
        """A cache over existing buffers (no copy): keys/values per layer, each (n_slots, K,
        S_max + 1, Hd), and lengths (n_slots,) int64; writes go into those tensors (what an
        exported decode step, which takes the buffers as inputs, runs on: clearlm.runtime.aot)."""
        cache = cls.__new__(cls)
        cache.keys, cache.values, cache.lengths = list(keys), list(values), lengths
        cache.n_slots, cache.max_seq_len = keys[0].shape[0], keys[0].shape[2] - 1
        return cache

    def grow(self, max_seq_len: int) -> None:
        """Hold ``max_seq_len`` positions from now on (≥ the current S_max): new buffers with
        the current ones' columns [0, S_max) copied in (what generation does instead of sizing
        a cache for every token it might make: clearlm.generation.loop.make_room).

        Raises:
            ValueError: ``max_seq_len`` is below the current S_max.
        """
        if max_seq_len < self.max_seq_len:
            raise ValueError(f"a cache of {self.max_seq_len} positions cannot shrink to "
                             f"{max_seq_len}")
        old = self.max_seq_len
        for buffers in (self.keys, self.values):
            for i, b in enumerate(buffers):
                n, k, _, hd = b.shape  # (n_slots, K, S_max + 1, Hd)
                grown = b.new_zeros((n, k, max_seq_len + 1, hd))
                grown[:, :, :old] = b[:, :, :old]  # the scratch column S_max is not kept
                buffers[i] = grown
        self.max_seq_len = max_seq_len

    @property
    def offset(self) -> int:
        """Slot 0's filled length (tokens). Reads a tensor: for callers and tests, never called
        inside a forward pass."""
        return int(self.lengths[0])

    def free(self, slot: int) -> None:
        """Mark a slot empty so a new sequence can take it (its old keys are simply overwritten)."""
        self.lengths[slot] = 0

    def truncate(self, length: int, slot: int = 0) -> None:
        """Roll ``slot`` back to its first ``length`` positions (tokens): what speculative
        decoding does with the drafted tokens the target rejected
        (clearlm.generation.speculative). Their keys stay in the buffer but nobody reads them:
        a query at position t sees keys s ≤ t only, and the next pass writes positions
        ``length`` onwards before it reads them.

        Raises:
            ContextLengthError: ``length`` is negative or past the cache's S_max.
        """
        if not 0 <= length <= self.max_seq_len:
            raise ContextLengthError(
                f"cannot roll the KV cache back to {length} positions; it holds {self.max_seq_len}"
            )
        self.lengths[slot] = length

    def rows(self, first: int, positions: torch.Tensor, n_keys: int | None = None) -> CacheRows:
        """The slots [first, first + B) as the rows of one forward pass (see :class:`CacheRows`).

        Args:
            first: slot of batch row 0 (row b uses slot first + b).
            positions: (B, T) int64 positions of the new tokens; −1 marks a padding token.
            n_keys: read back keys [0, n_keys) (a Python int the caller knows; None: all S_max).

        Raises:
            ContextLengthError: the rows or n_keys do not fit the cache.
        """
        B = positions.shape[0]
        if first < 0 or first + B > self.n_slots:
            raise ContextLengthError(
                f"rows {first}..{first + B - 1} are outside the cache's {self.n_slots} slots"
            )
        n_keys = self.max_seq_len if n_keys is None else n_keys
        if not 0 < n_keys <= self.max_seq_len:
            raise ContextLengthError(
                f"KV cache holds {self.max_seq_len} positions; cannot read {n_keys} keys"
            )
        return CacheRows(self, slice(first, first + B), positions, n_keys)


class CacheRows:
    """Where one forward pass writes and reads: a run of slots, the new tokens' positions, and
    how many key positions attention reads back.

    Batch row b writes its token t's key at column positions[b, t] of its slot, so rows at
    different lengths decode together, each at its own position (per-row offsets). We chose
    this over left padding: a sequence's keys sit at the same columns whatever batch it runs
    in, so a slot can join or leave a running batch without moving anything, and RoPE angles
    equal those of the sequence run alone. A padding token (position −1, e.g. a free slot in a
    fixed-size decode batch) writes to the scratch column S_max, which is never read.

    Reading back [0, n_keys) gives every row the same key axis S = n_keys; the attention mask
    (clearlm.model.attention.attention_mask, built once per forward pass) hides each row's
    keys past its own query positions: key s is visible to query t when s ≤ positions[b, t].
    Reading the whole buffer (n_keys = S_max) keeps shapes fixed for a compiled step but reads
    every unfilled column too. Measured on SmolLM2-135M decode with 64 cached tokens (CPU time,
    1 thread, ms/token, filled prefix vs whole buffer): S_max 256: 54 vs 56; 2048: 55 vs 71;
    8192: 55 vs 139. So the engine reads the filled prefix rounded up to a bucket (few distinct
    shapes), and single-sequence generation, whose cache is sized to prompt + new tokens,
    reads it whole.
    """

    def __init__(self, cache: KVCache, rows: slice, positions: torch.Tensor, n_keys: int) -> None:
        self.cache, self.slots, self.n_keys = cache, rows, n_keys
        self.positions = positions  # (B, T)
        scratch = torch.full_like(positions, cache.max_seq_len)
        self.columns = torch.where(positions >= 0, positions, scratch)  # (B, T) write columns
        B = positions.shape[0]
        slots = torch.arange(rows.start, rows.start + B, device=positions.device)  # (B,)
        self.slot_of = slots[:, None].expand_as(positions)  # (B, T) slot of each new token
        # one row (a single sequence): its T columns, for the eager write (update_and_fetch)
        self.row_columns = self.columns[0] if B == 1 else None  # (T,)

    def update_and_fetch(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write T new keys/values at their positions; return keys [0, n_keys) of these rows.

        Args:
            layer: block index.
            k, v: (B, K, T, Hd) new keys and values.

        Returns:
            (keys, values), each (B, K, n_keys, Hd): views into the buffers, no copy.
        """
        keys, values = self.cache.keys[layer], self.cache.values[layer]  # (n_slots, K, S+1, Hd)
        if k.dtype != keys.dtype:
            k, v = k.to(keys.dtype), v.to(values.dtype)
        if self.row_columns is not None and not torch.compiler.is_compiling():
            self.write_one_row(keys, values, k, v)
        else:
            # buffer[slot_of[b, t], :, columns[b, t]] = k[b, :, t]: an index_put_ on the whole
            # buffer, which Inductor keeps in place (a scatter_ into a slot view was compiled as
            # a copy of the whole buffer, written back after the scatter, in every layer and step).
            at = (self.slot_of, slice(None), self.columns)
            keys[at] = k.transpose(1, 2)  # (B, T, K, Hd)
            values[at] = v.transpose(1, 2)
        # (B, K, n_keys, Hd) views of these rows' slots
        return keys[self.slots, :, : self.n_keys], values[self.slots, :, : self.n_keys]

    def write_one_row(
        self, keys: torch.Tensor, values: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """The eager write of one row: k, v (1, K, T, Hd) into its slot at its T columns.

        The same values as the index_put_ of update_and_fetch, by index_copy_ along the
        positions: 2 µs a call against 5.6 µs (SmolLM2's decode shapes, 1 thread; a step
        writes 60 times). Not while compiling: the slot view would be copied whole."""
        keys[self.slots].index_copy_(2, self.row_columns, k)  # (1, K, S_max + 1, Hd) view
        values[self.slots].index_copy_(2, self.row_columns, v)

    def advance(self) -> None:
        """Count the new positions as filled, once every layer has written them: a slot's
        length becomes one past its highest position (padding rows keep theirs)."""
        lengths = self.cache.lengths
        last = self.positions.amax(dim=1) + 1  # (B,)
        lengths[self.slots] = torch.maximum(lengths[self.slots], last)
