"""The quantized product as a torch custom op, so ``torch.compile`` traces QuantLinear whole.

``torch.ops.clearlm.qmm(x, codes, scale, min, bits, block, int8)``: x (M, K) float32 → (M, N)
float32, y = x @ W.T for the packed weight W (N, K) (clearlm.quant.pack). The op calls the C++
kernel (``qmm``, or ``qmm_i8`` with ``int8=True`` where it was built) and falls back to pure torch
(dequantize + matmul) without one. Its fake (meta) implementation only gives the output's shape
and dtype, which is all Dynamo/Inductor need: the compiled graph calls the kernel as one opaque
node (no graph break). Eager QuantLinear calls the pybind function directly instead, which
skips the custom op's dispatch cost (a few µs per call, ~200 calls per decode step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clearlm.quant.kernels import load_kernels
from clearlm.quant.pack import Packed, dequantize_packed


def int8_available() -> bool:
    """Whether the int8-activation kernel was built (the C++ kernel on an AVX-512 VNNI CPU)."""
    kern = load_kernels()
    return kern is not None and kern.qmm_i8_available()


def qmm_eager(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, mn: torch.Tensor,
              bits: int, block: int, int8: bool) -> torch.Tensor:
    """(M, K) float32 → (M, N) float32: the kernel's product, or pure torch without a kernel.

    int8=True rounds x to int8 per block of 32 values (csrc/qgemv_i8.cpp); it is ignored (the
    exact product is computed) where that kernel is unavailable or K is not a multiple of 64."""
    kern = load_kernels()
    if kern is None:
        n = codes.shape[0]
        w = dequantize_packed(Packed(codes, scale, mn if mn.numel() else None, bits, block,
                                     "")).view(n, -1)
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
def _qmm_fake(x, codes, scale, mn, bits, block, int8):
    return x.new_empty(x.shape[0], codes.shape[0])  # (M, N) float32, no data
