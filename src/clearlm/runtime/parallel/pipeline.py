"""Pipeline parallel: rank r of N holds a contiguous range of blocks [start, stop).

The first rank also holds the embedding (and learned positions, OPT's project_in), the last
the final norm, project_out and the output projection (with a tied head, the embedding rows it
shares). One forward pass on every rank, in lockstep:

    rank 0:      embed → blocks [0, b1)           → send h (B, T, D) to rank 1
    rank r:      recv h from r − 1 → blocks [br, br+1) → send h to r + 1
    rank N − 1:  recv h → blocks → final norm → output projection → logits (B, T', V)
    then the last rank broadcasts the logits, so every rank's sampler (same seed,
    launch.shared_seed) draws the same token and feeds the same ids to the next step.

Each rank reads only its tensors from the file (slicing.py) and keeps a KV cache for its own
blocks only. Parameters of other ranks' blocks stay on the meta device: they take no memory.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from clearlm.config import ModelConfig
from clearlm.errors import DistributedError
from clearlm.model.kv_cache import KVCache
from clearlm.model.transformer import Transformer
from clearlm.runtime.parallel.launch import run
from clearlm.runtime.parallel.slicing import Plan, Take


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of each of ``parts`` contiguous ranges covering 0 … n − 1, sizes differing
    by at most one (the first ranges take the remainder)."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for r in range(parts):
        stop = start + base + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def stage_plan(config: ModelConfig, rank: int, world: int) -> Plan:
    """What rank ``rank`` of ``world`` reads: its blocks, and the ends of the model it holds.

    Raises:
        DistributedError: more ranks than blocks."""
    if world > config.n_layers:
        raise DistributedError(
            f"--pipeline-parallel {world} is more than the model's {config.n_layers} blocks"
        )
    start, stop = split_evenly(config.n_layers, world)[rank]
    first, last = rank == 0, rank == world - 1
    head_side = ("norm.", "project_out.", "lm_head.")

    def plan(name: str) -> Take | None:
        if name.startswith("layers."):
            return Take() if start <= int(name.split(".")[1]) < stop else None
        if name.startswith("embed_tokens."):
            keep = first or (last and config.tie_word_embeddings)
            return Take() if keep else None
        if name.startswith(("embed_positions.", "project_in.")):
            return Take() if first else None
        if name.startswith(head_side):
            return Take() if last else None
        return Take()

    return plan


class PipelineStage(Transformer):
    """One rank's share of the model; ``forward`` has Transformer's signature and result (every
    rank returns the full logits), so generation.py drives it unchanged on every rank."""

    def setup_stage(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.start, self.stop = split_evenly(self.config.n_layers, world)[rank]

    @property
    def dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.parameters() if not p.is_meta)

    def new_cache(self, batch_size: int, max_seq_len: int) -> KVCache:
        """A cache whose buffers exist only for this rank's blocks (others: empty tensors)."""
        c = self.config
        self.reserve_positions(max_seq_len)
        cache = KVCache(
            self.stop - self.start, batch_size, c.n_kv_heads, c.head_dim, max_seq_len,
            self.dtype, self.device,
        )  # fmt: skip
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        before, after = [empty] * self.start, [empty] * (c.n_layers - self.stop)
        cache.keys = before + cache.keys + after
        cache.values = before + cache.values + after
        return cache

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
        """tokens (B, T) → logits (B, T, V) or (B, 1, V), on every rank (see the module doc);
        arguments as Transformer.forward, whose preparation (positions, cache rows, masks,
        RoPE tables) every rank repeats alike.

        Raises:
            ContextLengthError: as Transformer.forward (on every rank alike).
            DistributedError: a neighbour died or did not answer within the timeout."""
        B, T = tokens.shape
        dev, c = self.device, self.config
        tokens, positions, rows, bound, masks, rope, rope_local = self.prepare(
            tokens, positions, cache, slot, n_keys
        )
        if self.rank == 0:
            x = self.embed(tokens, positions, bound)  # (B, T, D)
        else:
            x = torch.empty(B, T, c.d_model, dtype=self.dtype, device=dev)  # (B, T, D)
            run("recv", lambda: dist.recv(x, src=self.rank - 1))
        for i in range(self.start, self.stop):  # this rank's blocks only
            kind = c.layer_types[i]
            x = self.layers[i](
                x, rope_local if kind == "sliding" else rope, positions, rows, masks[kind]
            )
        if rows is not None:
            rows.advance()
        last = self.world - 1
        if self.rank != last:
            run("send", lambda: dist.send(x.contiguous(), dst=self.rank + 1))
        n = 1 if last_only else T
        if self.rank == last:
            logits = self.unembed(x[:, -n:, :]).contiguous()  # (B, n, V)
        else:
            logits = torch.empty(B, n, c.vocab_size, dtype=self.dtype, device=dev)
        run("the logits broadcast", lambda: dist.broadcast(logits, src=last))
        return logits
