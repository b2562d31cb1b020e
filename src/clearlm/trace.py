"""Named hook points at every stage of the seeds, in one table.

Every point is a tensor the forward pass computes anyway; a hook can read it (tracing) or
return a replacement (intervention, e.g. ablating a head). With no hook registered and nothing
being recorded, each point costs one attribute check (``HookRegistry.active``).

Shape letters: B batch, T tokens, S keys visible (= T without a cache), D d_model, H n_heads,
K n_kv_heads, Hd head_dim, F d_ff, V vocab_size. ``{i}`` is the block index (0 … N−1).
Names follow TransformerLens's scheme, shortened.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from clearlm.errors import ClearLMError

# name → (shape, what it is). The one place the naming scheme is documented.
HOOK_POINTS: dict[str, tuple[str, str]] = {
    "embed": ("(B, T, D)", "token embeddings (× embed_scale where the family scales them)"),
    "pos": ("(T, D)", "additive position encodings (learned or sinusoidal models only)"),
    "blocks.{i}.resid_pre": ("(B, T, D)", "the residual stream entering block i"),
    "blocks.{i}.attn.q": ("(B, H, T, Hd)", "queries, after q-norm and RoPE"),
    "blocks.{i}.attn.k": ("(B, K, T, Hd)", "the new tokens' keys, after k-norm and RoPE"),
    "blocks.{i}.attn.v": ("(B, K, T, Hd)", "the new tokens' values"),
    "blocks.{i}.attn.scores": (
        "(B, H, T, S)",
        "q·kᵀ × scale (soft-capped where the family does), causal/window mask applied (−inf)",
    ),
    "blocks.{i}.attn.pattern": ("(B, H, T, S)", "softmax of the scores: attention weights"),
    "blocks.{i}.attn.z": ("(B, T, H, Hd)", "each head's output, before the heads are mixed"),
    "blocks.{i}.attn.out": ("(B, T, D)", "attention output after o_proj"),
    "blocks.{i}.resid_mid": ("(B, T, D)", "residual stream between attention and FFN"),
    "blocks.{i}.ffn.pre_act": ("(B, T, F)", "input of the activation (the gate for gated FFNs)"),
    "blocks.{i}.ffn.act": ("(B, T, F)", "what enters down_proj: act(pre) (× up for gated FFNs)"),
    "blocks.{i}.ffn.out": ("(B, T, D)", "FFN output after down_proj"),
    "blocks.{i}.resid_post": ("(B, T, D)", "the residual stream leaving block i"),
    "final_norm": ("(B, T, D)", "the residual stream after the final norm"),
    "logits": ("(B, T, V)", "output projection (after any final soft-cap)"),
    "probs": ("(B, T, V)", "softmax of the logits (computed by run_with_trace, float32)"),
}

HookFn = Callable[[torch.Tensor, str], torch.Tensor | None]


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(name).replace(r"\{i\}", r"(\d+)") + "$")


_PATTERNS = [_pattern(n) for n in HOOK_POINTS]


def check_hook_name(name: str, n_layers: int) -> None:
    """Raise ClearLMError unless `name` is a hook point of a model with n_layers blocks."""
    for pattern in _PATTERNS:
        m = pattern.match(name)
        if m and (not m.groups() or int(m.group(1)) < n_layers):
            return
    raise ClearLMError(
        f"unknown hook point {name!r}; names look like: embed, blocks.0.attn.pattern, "
        f"blocks.{n_layers - 1}.resid_post, logits (see clearlm.trace.HOOK_POINTS)"
    )


@dataclass
class HookRegistry:
    """The hooks of one model, and what is being recorded. Shared by all its modules."""

    fns: dict[str, list[HookFn]] = field(default_factory=dict)
    record: dict[str, torch.Tensor] | None = None
    record_names: set[str] | None = None  # None: record every point

    @property
    def active(self) -> bool:
        return bool(self.fns) or self.record is not None

    def wants(self, name: str) -> bool:
        """Whether a point is read or replaced (lets attention skip computing its pattern)."""
        if name in self.fns:
            return True
        return self.record is not None and (self.record_names is None or name in self.record_names)

    def __call__(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Run the hooks registered at `name` on x (each may return a replacement), record."""
        for fn in self.fns.get(name, ()):
            out = fn(x, name)
            if out is not None:
                x = out
        if self.record is not None and (self.record_names is None or name in self.record_names):
            self.record[name] = x.detach().clone()  # cache views change later: keep a copy
        return x


@dataclass
class HookHandle:
    """Returned by add_hook; ``remove()`` takes the hook away again."""

    registry: HookRegistry
    name: str
    fn: HookFn

    def remove(self) -> None:
        fns = self.registry.fns.get(self.name, [])
        if self.fn in fns:
            fns.remove(self.fn)
        if not fns:
            self.registry.fns.pop(self.name, None)


def resolve_names(names: Iterable[str] | None, n_layers: int) -> set[str] | None:
    """Validate requested names (None = everything)."""
    if names is None:
        return None
    names = set(names)
    for n in names:
        check_hook_name(n, n_layers)
    return names
