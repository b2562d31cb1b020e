"""Named hook points at every stage of the seeds: the table of names, and the modules behind it.

Every point is a tensor the forward pass computes anyway; a hook can read it (tracing) or
return a replacement (intervention, e.g. ablating a head). Each point is a :class:`HookPoint`
module placed in the model where its tensor is computed (``x = self.hook_resid_pre(x)``), an
identity unless a hook or a recording is set on it. Its name comes from where it sits in the
module tree, as TransformerLens's ``HookedRootModule.setup()`` names its points from
``named_modules()``: the module path with transformers' container names shortened
(``layers`` → ``blocks``, ``self_attn`` → ``attn``, ``mlp`` → ``ffn``) and the ``hook_`` prefix
dropped, so ``layers.3.self_attn.hook_pattern`` is ``blocks.3.attn.pattern``.

Shape letters: B batch, T tokens, S keys visible (= T without a cache), D d_model, H n_heads,
K n_kv_heads, Hd head_dim, F d_ff, V vocab_size, E n_experts, k n_experts_used. ``{i}`` is the
block index (0 … N−1).
Names follow TransformerLens's scheme, shortened; TransformerLens's own names
(``blocks.0.attn.hook_pattern``) are accepted wherever a name is taken, in TransformerLens's
layout (:mod:`clearlm.model.hook_aliases`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from clearlm.errors import ClearLMError
from clearlm.model.hook_aliases import (
    LENS_NAMES,
    POS,
    Alias,
    check_lens_name,
    lens_alias,
    nearest_name,
    no_block_message,
)
from clearlm.model.hook_checks import check_hook_fn, check_output

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
    "blocks.{i}.ffn.out": ("(B, T, D)", "FFN output after down_proj (a mixture: its sum)"),
    # mixture-of-experts blocks (model/moe.py) have these three instead of pre_act and act
    "blocks.{i}.ffn.router_logits": ("(B, T, E)", "the router's logits over the E experts"),
    "blocks.{i}.ffn.expert_ids": ("(B, T, k)", "each token's k experts (int64), most likely first"),
    "blocks.{i}.ffn.expert_weights": ("(B, T, k)", "the weights their outputs are summed with"),
    "blocks.{i}.resid_post": ("(B, T, D)", "the residual stream leaving block i"),
    "final_norm": ("(B, T, D)", "the residual stream after the final norm"),
    "logits": ("(B, T, V)", "output projection (after any final soft-cap)"),
    "probs": ("(B, T, V)", "softmax of the logits (computed by run_with_trace, float32)"),
}
AFTER_FORWARD = ("probs",)  # in the table but computed after the pass: no module in the tree

HookFn = Callable[[torch.Tensor, str], torch.Tensor | None]


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(name).replace(r"\{i\}", r"(\d+)") + "$")


_PATTERNS = [_pattern(n) for n in HOOK_POINTS]


def check_hook_name(name: str, n_layers: int) -> None:
    """Raise ClearLMError unless `name` is a hook point of a model with n_layers blocks: one of
    HOOK_POINTS, or a TransformerLens name that has a clearlm equivalent (LENS_NAMES).

    The message for an unknown name suggests the nearest name of either vocabulary."""
    if not isinstance(name, str):
        raise ClearLMError(
            f"a hook point name is a string such as 'blocks.0.resid_post', got "
            f"{type(name).__name__} {name!r}"
        )
    for pattern in _PATTERNS:
        m = pattern.match(name)
        if m and m.groups() and int(m.group(1)) >= n_layers:
            raise ClearLMError(no_block_message(name, int(m.group(1)), n_layers))
        if m:
            return
    if check_lens_name(name, n_layers):  # ClearLMError: one with no clearlm equivalent
        return
    near = nearest_name(name, [*HOOK_POINTS, *LENS_NAMES], n_layers)
    hint = f"did you mean {near!r}?" if near else (
        f"names look like: embed, blocks.0.attn.pattern, blocks.{n_layers - 1}.resid_post, logits"
    )
    raise ClearLMError(
        f"unknown hook point {name!r}; {hint} (see clearlm.model.hooks.HOOK_POINTS, or the "
        "TransformerLens names of clearlm.model.hook_aliases.LENS_NAMES)"
    )


def resolve_names(names: Iterable[str] | None, n_layers: int) -> set[str] | None:
    """Validate requested names (None = everything)."""
    if names is None:
        return None
    names = {names} if isinstance(names, str) else set(names)  # one name, not its letters
    for n in names:
        check_hook_name(n, n_layers)
    return names


class DirectCall(nn.Module):
    """An nn.Module whose call goes straight to ``forward`` while no torch hook could run.

    Why: nn.Module.__call__ costs about 1.4 µs more than calling forward (its dispatch and
    hook checks), and a decode step makes some 150 calls of blocks, attention, FFNs and norms
    (SmolLM2). A module hook registered on this module, or a global one, takes the usual path,
    so ``register_forward_hook`` and friends behave as on any module. (Our own hook points are
    :class:`HookPoint`.)"""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
                or self._backward_pre_hooks or _global_module_hooks()):
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)


def _global_module_hooks() -> bool:
    """Whether a hook for every module is registered (torch.nn.modules.module's globals)."""
    m = torch.nn.modules.module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks
                or m._global_backward_hooks or m._global_backward_pre_hooks)


class HookPoint(nn.Module):
    """The identity at one named point of the forward pass, unless hooks or a recording are set.

    ``fns`` run in the order added, each as fn(x, name); one that returns a tensor replaces x
    (same shape, dtype and device; anything else but None is a ClearLMError naming the point).
    ``record``, when set, receives a detached copy of the final x under the point's name.
    ``name`` is given by :class:`HookRegistry` from the module tree.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = ""
        self.fns: list[HookFn] = []
        self.record: dict[str, torch.Tensor] | None = None

    @property
    def active(self) -> bool:
        """Whether the point is read or replaced (lets attention skip computing its pattern)."""
        return bool(self.fns) or self.record is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Why not nn.Module's own __call__ every time: its dispatch costs about 1 µs, and a
        # decode step passes some 330 points (SmolLM2); this keeps an idle point to ~0.2 µs.
        # torch.compile traces this without a graph break (the branch is a guard).
        if self.fns or self.record is not None:
            return super().__call__(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fn in self.fns:
            out = fn(x, self.name)
            if out is not None and out is not x:  # `is`: an in-place edit costs no check
                check_output(self.name, x, out)  # ClearLMError: not a tensor like x (~1.5 µs)
                x = out
        if self.record is not None:
            self.record[self.name] = x.detach().clone()  # cache views change later: keep a copy
        return x


_CONTAINERS = {"layers": "blocks", "self_attn": "attn", "mlp": "ffn"}


def hook_name(path: str) -> str:
    """Module path → hook point name: ``layers.0.mlp.hook_act`` → ``blocks.0.ffn.act``."""
    *parents, leaf = path.split(".")
    if not leaf.startswith("hook_"):
        raise ValueError(f"a HookPoint's attribute must start with 'hook_': {path!r}")
    return ".".join([_CONTAINERS.get(p, p) for p in parents] + [leaf.removeprefix("hook_")])


def lens_hook(alias: Alias, fn: HookFn) -> HookFn:
    """fn registered under a TransformerLens name: it receives the tensor in TransformerLens's
    layout (a view where possible, so in-place edits reach the pass) and the name it was
    registered under; what it returns (checked against what it received, in that layout) is
    converted back to clearlm's layout."""

    def hook(x: torch.Tensor, _name: str) -> torch.Tensor | None:
        lens_x = alias.to_lens(x)
        out = fn(lens_x, alias.name)
        if out is None:
            return None
        check_output(alias.name, lens_x, out)  # ClearLMError, in the layout fn saw
        back = alias.from_lens(out)
        # a (1, T, D) position encoding given as (T, D): back to the point's own shape
        return back.reshape(x.shape) if alias.layout == POS else back

    return hook


@dataclass
class HookHandle:
    """Returned by add; ``remove()`` takes the hook away again."""

    point: HookPoint
    fn: HookFn

    def remove(self) -> None:
        if self.fn in self.point.fns:
            self.point.fns.remove(self.fn)


class HookRegistry:
    """Every hook point of one model by name, named once from its module tree.

    Built after the model's modules exist (the Transformer's ``__init__`` ends with it).
    ``points`` maps names to HookPoints, in module-tree order. Every method that takes a name
    also takes a TransformerLens name (clearlm.model.hook_aliases), read and written in
    TransformerLens's layout; that needs the root's ``config`` (and ``norm``, the final norm).
    """

    def __init__(self, root: nn.Module) -> None:
        self.points: dict[str, HookPoint] = {}
        self.config = getattr(root, "config", None)
        self.final_norm: nn.Module | None = getattr(root, "norm", None)
        for path, parent in root.named_modules():
            for attr, child in parent.named_children():
                if isinstance(child, HookPoint):
                    child.name = hook_name(f"{path}.{attr}" if path else attr)
                    self.points[child.name] = child
                    # Why: reading ``self.hook_q`` otherwise goes through nn.Module.__getattr__
                    # (≈0.5 µs; a decode step reads some 330 points). The instance dict is
                    # looked up first; nn.Module.__setattr__ drops this entry on reassignment.
                    parent.__dict__[attr] = child
        self.n_layers = sum(name.endswith(".resid_pre") for name in self.points)

    @property
    def active(self) -> bool:
        """Whether any point has a hook or is being recorded."""
        return any(p.active for p in self.points.values())

    def point(self, name: str) -> HookPoint:
        """The HookPoint called `name` (a TransformerLens name: the point it stands for);
        ClearLMError for a name this model does not have."""
        return self.resolve(name)[0]

    def alias(self, name: str) -> Alias | None:
        """The TransformerLens alias `name` stands for on this model (None: a clearlm name).

        Raises ClearLMError for a TransformerLens name with no equivalent on this model."""
        if name in self.points or self.config is None:
            return None
        return lens_alias(name, self.config, self.final_norm)

    def resolve(self, name: str) -> tuple[HookPoint, Alias | None]:
        """The HookPoint for `name`, and the alias when it is a TransformerLens name.

        Raises:
            ClearLMError: unknown name (with the nearest suggested), or one this model lacks.
        """
        check_hook_name(name, self.n_layers)
        alias = self.alias(name)
        if alias is not None:
            name = alias.target
        if name not in self.points:
            why = {
                "probs": "it is computed after the forward pass; hook 'logits' instead",
                "pos": "positions enter inside attention (RoPE); hook 'blocks.{i}.attn.q'",
            }.get(name, "it is not in this model's module tree")
            raise ClearLMError(f"this model has no hook point {name!r}: {why}")
        return self.points[name], alias

    def add(self, name: str, fn: HookFn) -> HookHandle:
        """Call fn(tensor, name) whenever the pass reaches `name` (see HookPoint); under a
        TransformerLens name, with the tensor in its layout (see lens_hook)."""
        point, alias = self.resolve(name)
        check_hook_fn(name, fn)
        fn = fn if alias is None else lens_hook(alias, fn)
        point.fns.append(fn)
        return HookHandle(point, fn)

    def clear(self) -> None:
        """Remove every hook (a recording in progress goes on)."""
        for p in self.points.values():
            p.fns.clear()

    @contextmanager
    def temporary(
        self, fns: Mapping[str, HookFn] | Sequence[tuple[str, HookFn]]
    ) -> Iterator[None]:
        """Hooks that are removed when the block ends, also when it raises: a dict {name: fn}
        or a list of (name, fn) pairs (a name may repeat; they run in the order given). Every
        name is checked before any hook is added (ClearLMError: none is added)."""
        pairs = list(fns.items()) if isinstance(fns, Mapping) else fns
        if isinstance(fns, str | bytes) or not isinstance(pairs, Sequence) or not all(
            isinstance(p, tuple | list) and len(p) == 2 for p in pairs
        ):
            raise ClearLMError(
                "hooks take a dict {hook point name: function} or a list of (name, function) "
                "pairs, got " + type(fns).__name__
            )
        resolved = [self.resolve(name) for name, _ in pairs]
        for name, fn in pairs:
            check_hook_fn(name, fn)
        handles = []
        try:
            for (point, alias), (_, fn) in zip(resolved, pairs, strict=True):
                fn = fn if alias is None else lens_hook(alias, fn)
                point.fns.append(fn)
                handles.append(HookHandle(point, fn))
            yield
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def recording(self, names: set[str] | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Record the points named (None: all) during the block into the dict it yields.

        Names must be valid (see resolve_names); one this model lacks (``pos`` with RoPE,
        ``probs``) is simply not recorded. Points not named stay idle, so attention computes
        its pattern only when ``scores`` or ``pattern`` is wanted. A TransformerLens name is
        recorded under that name in its layout when the block ends (ClearLMError before
        anything runs for one with no equivalent on this model).
        """
        store: dict[str, torch.Tensor] = {}
        aliases = [a for a in map(self.alias, names or ()) if a is not None]
        wanted = None if names is None else set(names) | {a.target for a in aliases}
        chosen = [p for n, p in self.points.items() if wanted is None or n in wanted]
        before = [p.record for p in chosen]  # an enclosing recording resumes on exit
        for p in chosen:
            p.record = store
        try:
            yield store
            for a in aliases:  # in the alias's layout, under its name; targets asked stay
                if a.target in store:
                    store[a.name] = a.to_lens(store[a.target]).contiguous()
            for target in {a.target for a in aliases} - set(names or ()):
                store.pop(target, None)
        finally:
            for p, record in zip(chosen, before, strict=True):
                p.record = record
