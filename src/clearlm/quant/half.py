"""HalfLinear and HalfEmbedding: F16 / BF16 matrices kept 16-bit, as the GGUF stores them.

A float16 or bfloat16 value is exactly a float32 value (float16: 11 significant bits and a
narrower exponent; bfloat16: float32's top 16 bits), so widening costs no accuracy: these
layers give ``F.linear(x, W.float())`` and ``W.float()[ids]`` up to float32 summation order,
in the file's bytes (2 per weight, half of float32's).

Paths, by the number of rows M = B·T (as QuantLinear):
- M <= SMALL_M (decode): the C++ kernel (csrc/qgemv_half.cpp) widens each weight in registers
  and accumulates in float32; decode reads 2 bytes per weight instead of float32's 4.
- otherwise (prefill), or without the kernel: a band of rows at a time is widened to float32
  (about CHUNK_ELEMS values, 4 MiB) and multiplied with torch's float32 matmul.
Measured: bench/format_gemv.py and docs/models.md#weights-in-memory. torch's own 16-bit
``F.linear`` is not used: it rounds x to 16 bits (max |Δ| 0.04 for float16, 0.3 for bfloat16
on a 4864 × 896 product), and ``F.linear(x, W.float())`` at every call is 2.6× float32's time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import SMALL_M, band_rows
from clearlm.quant.ops import _constant_result

HALF_DTYPES = (torch.float16, torch.bfloat16)


def _check(weight: torch.Tensor) -> None:
    if weight.dtype not in HALF_DTYPES or weight.dim() != 2:
        raise ValueError(
            f"a 16-bit layer needs a 2-d float16/bfloat16 weight, got "
            f"{weight.dtype} {tuple(weight.shape)}"
        )


class HalfLinear(nn.Module):
    """y = x @ W.T + b with W (out_features, in_features) float16 or bfloat16 (buffer
    ``weight``, contiguous) and b (out_features,) float32 or None. x of any float dtype is
    computed in float32 and returned in its own dtype. Raises ValueError for a weight that is
    not 2-d 16-bit, or an x whose last dimension is not in_features."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        _check(weight)
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def weight_nbytes(self) -> int:
        return self.weight.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, k = x.shape  # (..., K)
        if k != self.in_features:
            raise ValueError(f"HalfLinear expects {self.in_features} input features, got {k}")
        x2 = x.reshape(-1, k)  # (M, K)
        if x2.dtype != torch.float32:
            x2 = x2.float()
        buf = self._buffers  # (a dict read: nn.Module.__getattr__ costs ~0.5 µs a read)
        w, bias = buf["weight"], buf["bias"]
        if torch.compiler.is_compiling():  # a traced graph: the kernel as one opaque node
            if x2.shape[0] <= SMALL_M and _kernel_op():
                y = torch.ops.clearlm_kernels.hmm(x2, w)  # (M, N)
                y = y if bias is None else y + bias
            else:
                y = F.linear(x2, w.float(), bias)
        elif x2.shape[0] <= SMALL_M and x2.is_cpu and (kern := load_kernels()) is not None:
            y = kern.hmm(x2, w)  # (M, N)
            if bias is not None:
                y += bias
        else:
            y = banded_linear(x2, w, bias)
        y = y.reshape(*lead, self.out_features)  # (..., N)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"dtype={str(self.weight.dtype).removeprefix('torch.')}, "
            f"bias={self.bias is not None}"
        )


_registered: list[bool] = []


@_constant_result
def _kernel_op() -> bool:
    """Whether the C++ operator ``clearlm_kernels::hmm`` exists (csrc/qgemv_ops.cpp registers
    it); registers its shape function once, so torch.compile traces it as one node."""
    if not _registered:
        ok = load_kernels() is not None and hasattr(torch.ops.clearlm_kernels, "hmm")
        if ok:
            torch.library.register_fake("clearlm_kernels::hmm")(_hmm_fake)
        _registered.append(ok)
    return _registered[0]


def _hmm_fake(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[0])  # (M, N) float32, no data


def banded_linear(x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(M, K) float32 × w (N, K) 16-bit → (M, N) float32: w widened to float32 a band of rows
    at a time (bands of :func:`~clearlm.quant.linear.band_rows`, as QuantLinear's), so the
    float32 copy stays about CHUNK_ELEMS values, not the matrix."""
    n, k = w.shape
    rows = band_rows(n, k)
    if rows >= n:
        return F.linear(x2, w.float(), bias)
    y = x2.new_empty(x2.shape[0], n)  # (M, N)
    # one float32 band reused: a fresh 4 MiB tensor per band is fresh pages, faulted in each
    # time (a 4864 x 896 decode product: 7.5 ms with fresh bands, 2.6 ms reusing one)
    buf = x2.new_empty(rows, k)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        w_t = buf[: r1 - r0].copy_(w[r0:r1]).t()  # (K, r1 - r0)
        band = y[:, r0:r1]  # (M, r1 - r0), written in place
        if bias is None:
            torch.mm(x2, w_t, out=band)
        else:
            torch.addmm(bias[r0:r1], x2, w_t, out=band)
    return y


class HalfEmbedding(nn.Module):
    """ids (...) int64 → (..., D) float32 rows of a (V, D) float16 / bfloat16 table (buffer
    ``weight``; a tied head's HalfLinear shares it). Raises IndexError for an id outside
    0 .. V - 1, as nn.Embedding."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        _check(weight)
        self.num_embeddings, self.embedding_dim = weight.shape
        self.register_buffer("weight", weight.contiguous())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).float()  # (..., D): only the rows asked for

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, "
            f"dtype={str(self.weight.dtype).removeprefix('torch.')}"
        )
