"""The quantized product as a torch custom op, so ``torch.compile`` traces QuantLinear whole.

Two kinds of operator, one for each case; :func:`compiled_qmm` picks:
- with the C++ kernel: ``torch.ops.clearlm_kernels.qmm`` / ``qmm_i8`` (x, codes, scale, min,
  bits, block), registered by csrc/qgemv_ops.cpp itself (TORCH_LIBRARY), so a compiled graph calls
  the kernel through the dispatcher without going back into Python;
- without it: ``torch.ops.clearlm.qmm(x, codes, scale, min, bits, block, int8)``, a Python
  custom op (torch.library.custom_op) computing dequantize + matmul in torch.
:func:`compiled_dequant` does the same for a whole dequantization (``clearlm_kernels::dequant``,
or ``clearlm::dequant``): an embedding lookup of K-quant heads or IQ4's table codes, whose torch
path reinterprets bytes or builds a table (quant/embedding.py).
Each has a fake (meta) implementation giving only the output's shape and dtype, (M, N) float32,
which is all Dynamo/Inductor need: QuantLinear is one opaque graph node (no graph break). Eager
QuantLinear calls the pybind function directly instead, which skips the dispatcher (a few µs per
call, ~200 calls per decode step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clearlm.quant.kernels import load_kernels
from clearlm.quant.pack import Packed, dequantize_packed


def _constant_result(fn):  # type: ignore[no-untyped-def]
    """``torch.compiler.assume_constant_result`` without its import of torch._dynamo (~0.7 s of
    CPU time at every start): that decorator only sets this attribute (torch/_dynamo/
    decorators.py), which Dynamo reads while tracing."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_result  # evaluated once while tracing, not traced into
def int8_available() -> bool:
    """Whether the int8-activation kernel was built (the C++ kernel on an AVX-512 VNNI or
    AVX2 CPU)."""
    kern = load_kernels()
    return kern is not None and kern.qmm_i8_available()


def qmm_eager(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor,
              bits: int, block: int, int8: bool) -> torch.Tensor:
    """(M, K) float32 → (M, N) float32: the kernel's product, or pure torch without a kernel.

    int8=True rounds x to int8 per block of 32 values (csrc/qgemv_i8.cpp); it is ignored (the
    exact product is computed) where that kernel is unavailable or K is not a multiple of 64."""
    kern = load_kernels()
    if kern is None:
        w = dequantize_packed(Packed(codes, scale, mn if mn.numel() else None, bits, block, ""))
        return F.linear(x, w)
    if int8 and x.shape[1] % 64 == 0 and kern.qmm_i8_available():
        return kern.qmm_i8(x, codes, scale, mn, bits, block)
    return kern.qmm(x, codes, scale, mn, bits, block)


@torch.library.custom_op("clearlm::qmm", mutates_args=())
def qmm(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor,
        bits: int, block: int, int8: bool) -> torch.Tensor:
    """x (M, K) float32 → x @ W.T (M, N) float32 for the packed W (see qmm_eager)."""
    return qmm_eager(x.contiguous(), codes, scale, mn, bits, block, int8)


@qmm.register_fake
def _qmm_fake(x, codes, scale, mn, bits, block, int8=False):
    n, _ = Packed(codes, scale, None, bits, block, "").shape  # rows, from the scale's layout
    return x.new_empty(x.shape[0], n)  # (M, N) float32, no data


@torch.library.custom_op("clearlm::dequant", mutates_args=())
def dequant(codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, bits: int,
            block: int) -> torch.Tensor:
    """The packed W (row-major or row tiles) → float32 (N, K), without the kernel."""
    return dequantize_packed(Packed(codes, scale, mn if mn.numel() else None, bits, block, ""))


@dequant.register_fake
def _dequant_fake(codes, scale, mn, bits, block):
    shape = Packed(codes, scale, None, bits, block, "").shape  # (N, K), from the scale's layout
    return scale.new_empty(shape, dtype=torch.float32)  # (N, K), no data


_registered: list[bool] = []


@_constant_result
def _kernel_ops() -> bool:
    """Whether the C++ operators exist; registers their fake implementations once."""
    if not _registered:
        ok = load_kernels() is not None and hasattr(torch.ops.clearlm_kernels, "qmm")
        if ok:
            for name in ("qmm", "qmm_i8"):
                torch.library.register_fake(f"clearlm_kernels::{name}")(_qmm_fake)
            torch.library.register_fake("clearlm_kernels::dequant")(_dequant_fake)
        _registered.append(ok)
    return _registered[0]


def compiled_qmm(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor,
                 bits: int, block: int, int8: bool) -> torch.Tensor:
    """The operator call QuantLinear makes while torch.compile traces it: (M, K) → (M, N)."""
    if not _kernel_ops():
        return torch.ops.clearlm.qmm(x, codes, scale, mn, bits, block, int8)
    if int8 and x.shape[1] % 64 == 0 and int8_available():
        return torch.ops.clearlm_kernels.qmm_i8(x, codes, scale, mn, bits, block)
    return torch.ops.clearlm_kernels.qmm(x, codes, scale, mn, bits, block)


def compiled_dequant(codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor, bits: int,
                     block: int) -> torch.Tensor:
    """The operator call QuantEmbedding makes for K-quant or IQ4 rows while torch.compile or export
    traces it: the gathered rows' codes, scale, min (empty for none) → float32 (R, K), the values
    of :func:`~clearlm.quant.pack.dequantize_packed` bit for bit."""
    if not _kernel_ops():
        return torch.ops.clearlm.dequant(codes, scale, mn, bits, block)
    return torch.ops.clearlm_kernels.dequant(codes, scale, mn, bits, block)
