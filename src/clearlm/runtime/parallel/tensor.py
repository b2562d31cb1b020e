"""Tensor parallel (Megatron-LM, Shoeybi et al. 2019, §3): every rank holds every block, but
only a slice of each large matrix; two all-reduces per block.

Per block, on rank r of N:
- attention: q_proj rows of this rank's query heads (whole heads, contiguous); k_proj/v_proj
  rows of the key/value heads those queries use (replicated when there are fewer key/value
  heads than ranks); o_proj the matching input columns → partial (B, T, D), **all-reduce**;
- FFN: gate_proj/up_proj rows [f0, f1) of d_ff, down_proj the same input columns → partial
  (B, T, D), **all-reduce**; biases of o_proj/down_proj are added once, after the sum;
- embedding: rows [v0, v1) of the vocabulary; a token outside gives zeros, an all-reduce sums
  the one row that exists (a vocab-parallel lookup); the output projection: the same rows →
  logits (B, T, V/N), **all-gathered** to (B, T, V) on every rank.
Norms, positions and small tensors are replicated. Uneven splits are allowed (SmolLM2's 9
heads over 2 ranks: 5 + 4); where a rank's query heads do not share key/value heads in equal
groups, it keeps one key/value head per query head (repeated rows), so SDPA's grouping holds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from clearlm.config import ModelConfig
from clearlm.errors import DistributedError
from clearlm.model.kv_cache import KVCache
from clearlm.model.transformer import Transformer
from clearlm.runtime.parallel.launch import run
from clearlm.runtime.parallel.pipeline import split_evenly
from clearlm.runtime.parallel.slicing import Plan, Take


def head_split(n_heads: int, n_kv_heads: int, rank: int, world: int) -> tuple[list[int], list[int]]:
    """(query heads, key/value heads) of rank ``rank``: contiguous query heads, and the kv heads
    they read: each once when every one serves the same number of the rank's queries, else one
    per query head (repeated).

    Raises:
        DistributedError: more ranks than query heads."""
    if world > n_heads:
        raise DistributedError(f"--tensor-parallel {world} is more than the {n_heads} heads")
    h0, h1 = split_evenly(n_heads, world)[rank]
    group = n_heads // n_kv_heads  # G query heads per kv head
    kv_of = [h // group for h in range(h0, h1)]
    kv = sorted(set(kv_of))
    if len({kv_of.count(k) for k in kv}) == 1:
        return list(range(h0, h1)), kv
    return list(range(h0, h1)), kv_of


def _rows(heads: list[int], head_dim: int) -> tuple[int, ...]:
    return tuple(h * head_dim + j for h in heads for j in range(head_dim))


def vocab_range(vocab: int, rank: int, world: int) -> tuple[int, int]:
    """[v0, v1) of the vocabulary on this rank: equal blocks of ceil(V / N) (the last shorter),
    so the all-gathered logits need only trimming."""
    per = -(-vocab // world)
    return min(rank * per, vocab), min((rank + 1) * per, vocab)


def shard_plan(config: ModelConfig, rank: int, world: int) -> Plan:
    """What rank ``rank`` of ``world`` reads of each parameter (see the module doc)."""
    c = config
    if c.n_experts or c.qk_norm_scope == "all":  # experts / norms that span every head
        raise DistributedError(
            f"--tensor-parallel does not split {c.family or c.architecture} (a mixture of "
            "experts or a q/k norm over all heads); run it in one process or with "
            "--pipeline-parallel"
        )
    q_heads, kv_heads = head_split(c.n_heads, c.n_kv_heads, rank, world)
    q_rows, kv_rows = _rows(q_heads, c.head_dim), _rows(kv_heads, c.head_dim)
    f0, f1 = split_evenly(c.d_ff, world)[rank]
    v0, v1 = vocab_range(c.vocab_size, rank, world)

    def plan(name: str) -> Take | None:
        if ".self_attn.q_proj." in name:
            return Take(rows=q_rows)
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            return Take(rows=kv_rows)
        if name.endswith(".self_attn.o_proj.weight"):
            return Take(cols=(q_heads[0] * c.head_dim, (q_heads[-1] + 1) * c.head_dim))
        if ".mlp.gate_proj." in name or ".mlp.up_proj." in name:
            return Take(rows=tuple(range(f0, f1)))
        if name.endswith(".mlp.down_proj.weight"):
            return Take(cols=(f0, f1))
        if name in ("embed_tokens.weight", "lm_head.weight"):
            return Take(rows=tuple(range(v0, v1)))
        return Take()

    return plan


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_r · W_rᵀ) + b: x_r (…, in_r) this rank's input features, W_r (out, in_r);
    the bias (out,) is added once, after the sum."""

    def __init__(self, in_local: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)  # (…, out): this rank's share of the sum
        run("all_reduce", lambda: dist.all_reduce(y))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Rows [start, start + V_r) of the embedding (V_r, E); tokens (B, T) → (B, T, E)."""

    def __init__(self, start: int, n_local: int, dim: int) -> None:
        super().__init__()
        self.start = start
        self.weight = nn.Parameter(torch.empty(n_local, dim))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start  # (B, T)
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)  # (B, T, E)
        x = x.masked_fill(outside[..., None], 0.0)
        run("all_reduce", lambda: dist.all_reduce(x))  # exactly one rank holds each row
        return x


class VocabParallelHead(nn.Module):
    """Output projection rows [start, start + V_r): x (B, T, E) → all-gathered logits (B, T, V)."""

    def __init__(self, n_local: int, dim: int, per: int, vocab: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_local, dim))
        self.per, self.vocab = per, vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)  # (B, T, V_r)
        if y.shape[-1] < self.per:  # the last block is shorter: pad for equal-size gathers
            y = F.pad(y, (0, self.per - y.shape[-1]))
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
        run("all_gather", lambda: dist.all_gather(parts, y.contiguous()))
        return torch.cat(parts, dim=-1)[..., : self.vocab]  # (B, T, V)


class TensorParallelModel(Transformer):
    """A Transformer whose large matrices are this rank's slices (build with :meth:`shard`, on
    the meta device, before the weights are assigned). ``forward`` is Transformer's."""

    def shard(self, rank: int, world: int) -> None:
        """Swap the full-size modules for this rank's slices (shapes only; no weights yet)."""
        c = self.config
        self.rank, self.world = rank, world
        q_heads, kv_heads = head_split(c.n_heads, c.n_kv_heads, rank, world)
        f0, f1 = split_evenly(c.d_ff, world)[rank]
        hd, d = c.head_dim, c.d_model
        for layer in self.layers:
            a = layer.self_attn
            a.n_heads, a.n_kv_heads = len(q_heads), len(kv_heads)
            a.q_proj = nn.Linear(d, len(q_heads) * hd, bias=c.attn_bias)
            a.k_proj = nn.Linear(d, len(kv_heads) * hd, bias=c.attn_bias)
            a.v_proj = nn.Linear(d, len(kv_heads) * hd, bias=c.attn_bias)
            a.o_proj = RowParallelLinear(len(q_heads) * hd, d, c.attn_out_bias)
            m = layer.mlp
            for name in ("gate_proj", "up_proj"):
                if hasattr(m, name):
                    old = getattr(m, name)
                    setattr(m, name, nn.Linear(d, f1 - f0, bias=old.bias is not None))
            m.down_proj = RowParallelLinear(f1 - f0, d, m.down_proj.bias is not None)
        self.n_kv_local = len(kv_heads)
        v0, v1 = vocab_range(c.vocab_size, rank, world)
        self.embed_tokens = VocabParallelEmbedding(v0, v1 - v0, c.embed_dim)
        self.lm_head = VocabParallelHead(
            v1 - v0, c.embed_dim, -(-c.vocab_size // world), c.vocab_size
        )
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def new_cache(self, batch_size: int, max_seq_len: int) -> KVCache:
        """Keys/values of this rank's key/value heads only: (B, K_r, S_max, Hd) per layer."""
        c, p = self.config, self.embed_tokens.weight
        self.reserve_positions(max_seq_len)
        return KVCache(
            c.n_layers, batch_size, self.n_kv_local, c.head_dim, max_seq_len, p.dtype, self.device
        )
