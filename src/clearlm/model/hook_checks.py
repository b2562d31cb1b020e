"""Checks on what a user hands the hook points (:mod:`clearlm.model.hooks`): the function's
signature when it is registered, and the value it returns on each call.

Why here: a hook function is user code run deep inside the forward pass. A wrong signature or
a returned value of the wrong shape, dtype or type would otherwise surface as a TypeError or a
broadcasting error from some later matmul, far from its cause, or not at all (a tensor that
broadcasts silently changes the answer). Each check raises one ClearLMError line naming the
hook point and what was expected.

Two calling conventions meet here: clearlm calls ``fn(tensor, name)`` (``model.hooks({name:
fn})``, ``transformer.hooks.add``); TransformerLens calls ``fn(activation, hook=HookInfo)``
(``fwd_hooks=[(name, fn)]``, ``run_with_hooks``).
"""

from __future__ import annotations

import inspect

import torch

from clearlm.errors import ClearLMError


def _signature(fn: object) -> inspect.Signature | None:
    """fn's signature, None where Python cannot tell (some builtins, C extensions)."""
    try:
        return inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _looks_like_lens(sig: inspect.Signature) -> bool:
    """Whether the second positional parameter is called ``hook``: TransformerLens's
    ``fn(activation, hook)``, which would receive clearlm's name (a str) as ``hook``."""
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]  # fmt: skip
    return len(positional) >= 2 and positional[1].name == "hook"


def check_hook_fn(name: str, fn: object) -> None:
    """Raise ClearLMError unless fn can be called as clearlm calls a hook, ``fn(tensor, name)``.

    Refused: a value that is not callable, a function that cannot take two positional
    arguments, and a TransformerLens-style ``fn(activation, hook)`` (second parameter named
    ``hook``: it would get a str), which belongs in ``fwd_hooks=[(name, fn)]``."""
    if not callable(fn):
        raise ClearLMError(
            f"the hook for {name!r} must be a function fn(tensor, name), got {type(fn).__name__}"
        )
    sig = _signature(fn)
    if sig is None:
        return
    if _looks_like_lens(sig):
        raise ClearLMError(
            f"the hook for {name!r} takes (tensor, hook), TransformerLens's signature; "
            "clearlm's hooks={name: fn} call fn(tensor, name): pass it as "
            f"fwd_hooks=[({name!r}, fn)] instead"
        )
    try:
        sig.bind(None, name)
    except TypeError:
        raise ClearLMError(
            f"the hook for {name!r} must take two arguments, fn(tensor, name); its signature "
            f"is {sig}"
        ) from None


def check_lens_fn(name: str, fn: object) -> None:
    """Raise ClearLMError unless fn can be called as TransformerLens calls a hook,
    ``fn(activation, hook=hook)`` (a clearlm-style ``fn(tensor, name)`` cannot)."""
    if not callable(fn):
        raise ClearLMError(
            f"the hook for {name!r} must be a function fn(activation, hook), got "
            f"{type(fn).__name__}"
        )
    sig = _signature(fn)
    if sig is None:
        return
    try:
        sig.bind(None, hook=None)
    except TypeError:
        raise ClearLMError(
            f"fwd_hooks calls fn(activation, hook=hook) as TransformerLens does, and the hook "
            f"for {name!r} has the signature {sig}: name its second parameter 'hook', or pass "
            "a clearlm-style fn(tensor, name) as hooks={name: fn}"
        ) from None


def _describe(t: torch.Tensor) -> str:
    """``(1, 9, 5, 5) float32 on cpu``."""
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"


def check_output(name: str, x: torch.Tensor, out: object) -> None:
    """Raise ClearLMError unless a hook's return value ``out`` can replace its input ``x``:
    None (keep x) or a tensor of x's shape, dtype and device.

    Cost: one isinstance and three comparisons, run only on hooked calls."""
    if isinstance(out, torch.Tensor):
        if out.shape == x.shape and out.dtype == x.dtype and out.device == x.device:
            return
        raise ClearLMError(
            f"hook on {name} returned {_describe(out)}; expected {_describe(x)}, the shape, "
            "dtype and device of its input (return None to keep the input)"
        )
    raise ClearLMError(
        f"hook on {name} returned {type(out).__name__}; return a tensor of the input's shape "
        f"{tuple(x.shape)} and dtype, or None to keep the input"
    )
