"""Opt-in matmul precision for prefill: "highest" (exact float32, the default) or "medium".

The names are torch's own (``torch.set_float32_matmul_precision``). With "medium", every forward
pass of more than ``SMALL_M`` new tokens per sequence (T, the input's second dimension: a
prompt's prefill, of any batch size) runs inside a scope where torch may compute float32
matrix products from bfloat16-rounded inputs with float32 accumulation and float32 outputs
(oneDNN on the CPU: the AMX or AVX512-BF16 units where present). That covers the float32
``nn.Linear`` layers, the compact layers' prefill bands (clearlm.quant.linear: each band is
dequantized to float32 and multiplied by F.linear) and the output head when it gets more than
SMALL_M positions (not a last_only prefill's last row). Forwards of T <= SMALL_M are not
touched: decode (T = 1) of any batch size stays exact float32, also a batch of more than
SMALL_M sequences whose B*T rows take the compact layers' band path; so does anything outside
the model's forward: the global setting is restored when the forward returns or raises.
Keying on T, not B*T, keeps that promise for batched decoding (a server's slots, ``generate``
with many prompts), where B*T = B grows past SMALL_M.

Why a scope around F.linear on float32 tensors, not bfloat16 tensors: measured on this
machine (Xeon with AMX-BF16, 1 thread, process time, 512x896 @ 896x4864): float32 22.9 ms;
scoped "medium" 7.8 ms, max |error| 0.017 on outputs of scale 8; bfloat16 F.linear with the
conversions and ``.float()`` 5.7 ms, error 0.028 (its output is rounded to bfloat16 too). On
whole prefills (pp512, 1 thread) the scope was as fast or faster than bfloat16 bands (SmolLM2
516 vs 463 tok/s, Qwen2.5-0.5B 290 vs 277) and closer to float32, so bands stay float32.

Honest limits: "medium" is only faster where the CPU has bfloat16 matrix units (AMX-BF16, or at
least AVX512-BF16); elsewhere oneDNN may convert and compute slower than float32, or fall back
to float32 (then nothing changes). It is never switched on by itself. Results are no longer
the float32 reference: tests/runtime/test_precision.py bounds the distance, README "Speed" lists it.
The setting is process-wide while a forward runs: another thread's float32 matmuls in that
window get it too. A model in bfloat16/float16 is unaffected (its products are half already).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from clearlm.errors import SamplingParamsError
from clearlm.quant.linear import SMALL_M

MATMUL_PRECISIONS = ("highest", "medium")


def parse_matmul_precision(value: Any) -> str:
    """ "highest" or "medium" (None: "highest"). Raises SamplingParamsError for anything else."""
    if value is None:
        return "highest"
    if not isinstance(value, str) or value not in MATMUL_PRECISIONS:
        raise SamplingParamsError(
            f"unknown matmul_precision {value!r}; use {' or '.join(MATMUL_PRECISIONS)}"
        )
    return value


@contextmanager
def float32_matmul_precision(mode: str) -> Iterator[None]:
    """Run the body with ``torch.set_float32_matmul_precision(mode)``; the previous value is
    restored on exit, also when the body raises."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(mode)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _seq_len(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """T of a forward's first argument: token ids (B, T) or hidden states (B, T, D); 0 else."""
    x = args[0] if args else kwargs.get("tokens")
    return int(x.shape[1]) if isinstance(x, torch.Tensor) and x.dim() >= 2 else 0


class _Scope:
    """The forward hooks of one model: enter "medium" before a forward of T > SMALL_M and
    restore the saved setting after it (a stack: a forward inside a forward restores too).
    Decode-sized forwards touch nothing (no Python state changes inside a compiled step)."""

    def __init__(self) -> None:
        self.saved: list[str] = []
        self.head_saved: list[str] = []

    def before(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if _seq_len(args, kwargs) > SMALL_M:
            self.saved.append(torch.get_float32_matmul_precision())
            torch.set_float32_matmul_precision("medium")

    def after(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
    ) -> None:
        if _seq_len(args, kwargs) > SMALL_M and self.saved:
            torch.set_float32_matmul_precision(self.saved.pop())

    # The output projection (and project_out) of a last_only forward sees T = 1, not T: such
    # a call runs at the caller's setting, as decode does (measured, 1 thread, 1 x 640 @
    # 640 x 262144: float32 48 ms, "medium" 68 ms: the weight's conversion costs more than it
    # saves), and its logits stay exact.
    def head_before(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self.saved and _seq_len(args, {}) <= SMALL_M:
            self.head_saved.append(torch.get_float32_matmul_precision())
            torch.set_float32_matmul_precision(self.saved[-1])

    def head_after(self, module: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
        if self.saved and _seq_len(args, {}) <= SMALL_M and self.head_saved:
            torch.set_float32_matmul_precision(self.head_saved.pop())


def set_matmul_precision(net: torch.nn.Module, mode: str) -> torch.nn.Module:
    """Make ``net``'s forward passes of more than SMALL_M tokens per sequence (T) run at ``mode``
    ("medium"), or undo that ("highest": exactly today's float32 path). Sets
    ``net.matmul_precision``; returns ``net``. Raises SamplingParamsError for another mode."""
    mode = parse_matmul_precision(mode)
    for handle in getattr(net, "_precision_hooks", ()):
        handle.remove()
    net._precision_hooks = ()  # type: ignore[assignment]
    if mode == "medium":
        scope = _Scope()
        hooks = [
            net.register_forward_pre_hook(scope.before, with_kwargs=True),
            net.register_forward_hook(scope.after, with_kwargs=True, always_call=True),
        ]
        for name in ("lm_head", "project_out"):  # they see only the last rows (last_only)
            head = getattr(net, name, None)
            if isinstance(head, torch.nn.Module):
                hooks.append(head.register_forward_pre_hook(scope.head_before))
                hooks.append(head.register_forward_hook(scope.head_after, always_call=True))
        net._precision_hooks = tuple(hooks)  # type: ignore[assignment]
    net.matmul_precision = mode  # type: ignore[assignment]
    return net


def cpu_has_bf16_units() -> bool:
    """Whether this CPU lists bfloat16 matrix or dot-product units (Linux /proc/cpuinfo flags
    amx_bf16 or avx512_bf16), where "medium" was measured to be faster. False when unknown."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags
