"""The whole decoder: embedding (+ positions) → N blocks → final norm → output projection."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from clearlm.config import ModelConfig
from clearlm.errors import ContextLengthError
from clearlm.model.attention import attention_mask
from clearlm.model.block import Block
from clearlm.model.hooks import HookPoint, HookRegistry
from clearlm.model.kv_cache import KVCache
from clearlm.model.norms import make_norm
from clearlm.model.positions import RotaryEmbedding, sinusoidal_table


class Transformer(nn.Module):
    """A decoder-only Transformer that keeps no hidden state between calls.

    Parameter names follow transformers' Llama (without its ``model.`` prefix):
    ``embed_tokens``, ``embed_positions`` (learned positions), ``layers.{i}.self_attn.q_proj``,
    ``layers.{i}.mlp.gate_proj``, ``norm``, ``lm_head``. Other families' names are mapped to
    these at load time. With ``tie_word_embeddings`` the output projection is the embedding.
    When ``embed_dim`` E ≠ d_model D (OPT-350m), ``project_in`` (E → D) follows the token lookup
    and ``project_out`` (D → E) precedes the output projection. Its HookPoints (``hook_embed``
    here, ``layers.{i}.self_attn.hook_q`` …) are named from the module tree by ``self.hooks``
    (clearlm.model.hooks).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.embed_dim)
        if c.embed_dim != c.d_model:  # OPT-350m: tokens live in E, the blocks in D
            self.project_in = nn.Linear(c.embed_dim, c.d_model, bias=False)
            self.project_out = nn.Linear(c.d_model, c.embed_dim, bias=False)
        if c.position == "learned":
            self.embed_positions = nn.Embedding(c.context_length + c.position_offset, c.d_model)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.n_layers))
        if c.final_norm:
            self.norm = make_norm(c)
        self.lm_head = nn.Linear(c.embed_dim, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.hook_embed = HookPoint()
        if c.position != "rope":
            self.hook_pos = HookPoint()
        self.hook_final_norm, self.hook_logits = HookPoint(), HookPoint()
        self.hooks = HookRegistry(self)  # every HookPoint, named from its place in the tree
        self.init_derived()

    def init_derived(self) -> None:
        """(Re)build the tables computed from the config, not stored in checkpoints: RoPE
        cos/sin and sinusoidal encodings. Called again after loading onto the meta device."""
        c = self.config
        self.rope = self.rope_local = None
        if c.position == "rope":
            self.rope = RotaryEmbedding(c.rope_dim, c.rope_theta, c.context_length, c.rope_scaling)
            if c.rope_local_theta is not None:  # Gemma 3: sliding layers use their own base
                self.rope_local = RotaryEmbedding(c.rope_dim, c.rope_local_theta, c.context_length)
        if c.position == "sinusoidal":  # grown on demand in embed, as RoPE's tables are
            n = min(c.context_length, RotaryEmbedding.TABLE_START) + c.position_offset
            self.register_buffer(
                "sinusoids", sinusoidal_table(n, c.d_model, "fairseq"), persistent=False
            )

    # --- device and cache hooks (issue 12): the parallel models (clearlm.runtime.parallel) override
    # new_cache to hold only their ranks' layers / heads.
    @property
    def device(self) -> torch.device:
        """Where the weights live (the first parameter not on the meta device)."""
        for p in self.parameters():
            if not p.is_meta:
                return p.device
        return torch.device("cpu")

    def reserve_positions(self, n: int) -> None:
        """Build the RoPE tables for positions < n now, eagerly (each cache's creation calls it),
        so that no decode step, compiled or exported, rebuilds a table buffer."""
        for rope in (self.rope, self.rope_local):
            if rope is not None:
                rope.reserve(n)

    def new_cache(self, batch_size: int, max_seq_len: int) -> KVCache:
        """A KV cache of ``batch_size`` slots for ``max_seq_len`` positions, on the weights'
        device, in their dtype (the first floating-point parameter's: compact weight modules
        hold packed codes). Grows the RoPE tables to its positions first (reserve_positions)."""
        c = self.config
        self.reserve_positions(max_seq_len)
        dtype = next(p.dtype for p in self.parameters() if p.is_floating_point() and not p.is_meta)
        return KVCache(
            c.n_layers, batch_size, c.n_kv_heads, c.head_dim, max_seq_len, dtype, self.device
        )

    def embed(
        self, tokens: torch.Tensor, positions: torch.Tensor, bound: int | None = None
    ) -> torch.Tensor:
        """Stage 1: tokens (B, T) → H0 = Embedding(token) · scale + PositionEncoding (B, T, D).

        positions: (T,) shared by the rows, or (B, T) per row (−1: padding). With RoPE,
        position enters later, inside attention, and nothing is added here. bound: a Python int
        above every position (None: read from ``positions``, a host sync).
        """
        x = self.embed_tokens(tokens)  # (B, T, D)
        c = self.config
        if c.embed_scale != 1.0:
            # transformers rounds the scale to the activations' dtype first (Gemma's normalizer).
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        if c.embed_dim != c.d_model:
            x = self.project_in(x)  # (B, T, E) → (B, T, D)
        x = self.hook_embed(x)
        if c.position == "rope":
            return x
        positions = positions.clamp(min=0)  # padding (−1) reads row 0; its output is discarded
        if c.position == "learned":
            pos = self.embed_positions(positions + c.position_offset)  # (T, D) or (B, T, D)
        else:
            if bound is None:
                bound = int(positions.max()) + 1 if positions.numel() else 0
            need = bound + c.position_offset
            if need > len(self.sinusoids):  # rows depend only on their position: same values
                n = min(max(need, 2 * len(self.sinusoids)), c.context_length + c.position_offset)
                self.sinusoids = sinusoidal_table(n, c.d_model, "fairseq").to(x.device)
            pos = self.sinusoids[positions + c.position_offset].to(x.dtype)  # (T, D) / (B, T, D)
        return x + self.hook_pos(pos)  # (B, T, D): (T, D) broadcast over the batch

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """Stage 4: residual stream (B, T, D) → final norm → output projection → logits (B, T, V).

        Also what the logit lens applies to every block's output."""
        if self.config.final_norm:
            x = self.norm(x)
        x = self.hook_final_norm(x)
        if self.config.embed_dim != self.config.d_model:
            x = self.project_out(x)  # (B, T, D) → (B, T, E)
        logits = self.lm_head(x)  # (B, T, V)
        cap = self.config.final_logit_softcap
        if cap is not None:  # Gemma 2: cap · tanh(logits / cap) keeps logits in (-cap, cap)
            logits = torch.tanh(logits / cap) * cap
        return self.hook_logits(logits)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        *,
        slot: int = 0,
        n_keys: int | None = None,
    ) -> torch.Tensor:
        """Run the stack on new tokens.

        Nothing here reads a tensor back to Python when a cache is given (no ``.item()``, no
        branch on values), so a one-token decode step has static shapes and compiles without
        graph breaks; checking that positions fit the context is the caller's job there (it
        knows the lengths in Python: clearlm.generation.loop.check_fits).

        Args:
            tokens: (B, T) int64 token ids.
            positions: (B, T) int64 positions per row (−1 marks a padding token: it sees
                nothing useful, nobody sees it and it is not cached), or (T,) shared by the
                rows. Default: 0 … T-1; with a cache, each slot's filled length onwards.
            cache: keys/values of earlier positions; row b reads and writes slot ``slot + b``
                and each slot's length moves past its new positions once every block has
                written (see clearlm.model.kv_cache).
            last_only: project only the last position to logits (what generation needs;
                saves a (T-1) × D × V matmul).
            slot: the cache slot of row 0.
            n_keys: with a cache, attend to key positions [0, n_keys) only (a Python int ≥
                every position + 1, which the caller knows); None attends to the whole buffer
                (S_max: fixed shapes, what a compiled step wants) with the mask hiding unfilled
                positions.

        Returns:
            logits (B, T, V) float, or (B, 1, V) with last_only.

        Raises:
            ContextLengthError: without a cache, positions run past the model's context
            length; with one, the rows or n_keys do not fit it.
        """
        tokens, positions, rows, bound, masks, rope, rope_local = self.prepare(
            tokens, positions, cache, slot, n_keys
        )
        x = self.embed(tokens, positions, bound)  # (B, T, D)
        for layer, kind in zip(self.layers, self.config.layer_types, strict=True):
            local = kind == "sliding"
            x = layer(x, rope_local if local else rope, positions, rows, masks[kind])
        if rows is not None:
            rows.advance()
        if last_only:
            x = x[:, -1:, :]  # (B, 1, D)
        return self.unembed(x)

    def prepare(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None,
        cache: KVCache | None,
        slot: int = 0,
        n_keys: int | None = None,
    ) -> tuple[Any, ...]:
        """What every block of one forward pass shares, computed once (arguments as forward's):
        (tokens on the weights' device, positions (B, T) or (T,), the cache rows or None, the
        positions' bound (a Python int), the masks per layer kind, (cos, sin_rot) RoPE tables for
        full and for sliding layers, or None). A pipeline stage (clearlm.runtime.parallel) runs the
        same preparation on every rank.

        Raises:
            ContextLengthError: as forward.
        """
        B, T = tokens.shape
        tokens = tokens.to(self.device)  # ids built on the CPU (generation, api) follow the weights
        if positions is not None:
            positions = positions.to(tokens.device)
        ctx = self.config.context_length
        rows = None
        if cache is not None:
            if positions is None:
                start = cache.lengths[slot : slot + B, None]  # (B, 1) each slot's length
                positions = start + torch.arange(T, device=tokens.device)  # (B, T)
            rows = cache.rows(slot, positions.expand(B, T), n_keys)
            keys: torch.Tensor | int = rows.n_keys  # key s sits at position s
            bound = min(rows.n_keys, ctx)  # every position is below n_keys
        else:
            if positions is None:
                positions = torch.arange(T, device=tokens.device)  # (T,)
                bound = T
            else:  # reads the positions back: not the decode path
                bound = int(positions.max()) + 1 if positions.numel() else 0
            if bound > ctx:
                raise ContextLengthError(
                    f"position {bound - 1} is past the model's context length ({ctx} tokens)"
                )
            keys = positions  # the keys are the new tokens themselves
        masks = self.masks(positions, keys)  # built once, shared by the layers of each kind
        rope = self.rope_tables(self.rope, positions, bound)  # cos, sin_rot
        rope_local = self.rope_tables(self.rope_local, positions, bound) or rope
        return tokens, positions, rows, bound, masks, rope, rope_local

    @staticmethod
    def rope_tables(
        rope: RotaryEmbedding | None, positions: torch.Tensor, bound: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin_rot) of the positions, (T, d) or per row (B, 1, T, d): already broadcast
        over the heads, once per pass rather than in every layer's apply_rope; None without
        RoPE."""
        if rope is None:
            return None
        cos, sin_rot = rope(positions, bound)
        if cos.dim() == 3:  # (B, T, d) → (B, 1, T, d)
            cos, sin_rot = cos[:, None], sin_rot[:, None]
        return cos, sin_rot

    def masks(self, positions: torch.Tensor, keys: torch.Tensor | int) -> dict[str, torch.Tensor]:
        """One attention mask per layer kind ("full", "sliding"): (B or 1, 1, T, S) bool.

        positions (B, T) or (T,) query positions; keys (B, S) / (S,) key positions or an int S
        for arange(S) (see clearlm.model.attention.attention_mask)."""
        out = {}
        for kind in set(self.config.layer_types):
            window = self.config.sliding_window if kind == "sliding" else None
            mask = attention_mask(positions, keys, window)  # (B, T, S) or (T, S)
            out[kind] = mask.view(-1, 1, *mask.shape[-2:])  # (B or 1, 1, T, S)
        return out
