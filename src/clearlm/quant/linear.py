"""QuantLinear: a drop-in for nn.Linear whose weight stays in the compact block-quantized form.

Paths (chosen per call by the number of rows M = B*T):
- M <= SMALL_M (decode, T = 1, one row per sequence of a batch): the C++ kernel
  (``csrc/qgemv.cpp``) reads the codes and scales, rebuilds each weight in registers and
  accumulates in float32; the weight rows are read once for all M input rows, and each block's
  weights are rebuilt once per tile of 4 rows of x.
- M > SMALL_M (prefill): the weight is dequantized a band of output rows at a time (kernel,
  or pure torch without it; bands of equal rows, about CHUNK_ELEMS values) and multiplied with
  torch's float32 matmul, so prefill keeps the speed of dense float32 while the temporary
  float32 copy stays small (4 MiB, not the vocabulary-sized head).
Both reproduce ``F.linear(x, W_deq, bias)`` up to float32 summation order (W_deq: the GGUF's
dequantized float32 weight, see pack.py); tests/quant/test_quant.py bounds the difference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from clearlm.quant.kernels import load_kernels
from clearlm.quant.ops import compiled_qmm, qmm_eager
from clearlm.quant.pack import Packed, PackedModule, dequantize_packed

# Measured (1 thread, CPU time, every decode matrix of SmolLM2 / Qwen2.5-0.5B / Gemma 3 270M):
# kernel vs dequantize + matmul at M = 16: 50 / 206 / 119 ms vs 99 / 317 / 186; at M = 32:
# 97 / 397 / 227 vs 112 / 384 / 221 (even), so the kernel serves up to 16 rows.
SMALL_M = 16
# Float32 values per dequantized band (about 4 MiB). Measured pp512 (2 threads, Zen 3, one
# process, six alternations with the former bands: as many rows as fit 16 MiB, then a remainder,
# e.g. Qwen2.5's 896 x 4,864 down projection as 862 + 34 rows): Qwen2.5-0.5B 151-168 -> 175-186
# tok/s, Gemma 3 270M 567-592 -> 580-600, SmolLM2 537-575 -> 570-584; the logits bit-identical.
CHUNK_ELEMS = 1 << 20
# Band rows are a multiple of this: a band's first output column is then as aligned in the
# result as F.linear's would be, and torch's matmul gives each output the same sum bit for bit
# (tests/quant/test_quant.py: the torch path equals F.linear exactly; bands of 27 rows did not).
BAND_ROWS = 64


def band_rows(n: int, k: int) -> int:
    """Rows per band when an (n, k) weight is widened to float32 a band at a time: the fewest
    bands of about CHUNK_ELEMS values, equal rows rounded up to whole BAND_ROWS (alignment);
    the last band takes what is left. ``>= n``: one band, the whole matrix."""
    bands = max(1, -(-n * k // CHUNK_ELEMS))  # ceil
    per_band = -(-n // bands)
    return -(-per_band // BAND_ROWS) * BAND_ROWS


class QuantLinear(PackedModule):
    """y = x @ W.T + b with W (out_features, in_features) held as a :class:`Packed` weight.

    Buffers: ``codes`` (int8 (N, K) or uint8 (N, K/2)), ``scale`` (N, K/block) float16/32,
    ``min`` (same, or empty), ``bias`` (N,) float32 or None. Inputs of any float dtype are
    computed in float32 and returned in their own dtype. With ``int8`` True (opt-in, see
    :func:`set_int8_activations`) decode-sized calls round x to int8 per block of 32 values and
    use the int8 kernel (csrc/qgemv_i8.cpp, AVX-512 VNNI or AVX2): faster, no longer exact
    (tests/quant/test_quant_i8.py bounds the difference)."""

    def __init__(self, packed: Packed, bias: torch.Tensor | None = None) -> None:
        super().__init__(packed)
        self.out_features, self.in_features = packed.shape
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.int8 = False  # decode with int8-rounded activations (set_int8_activations)

    def dequantized(self, r0: int = 0, r1: int | None = None) -> torch.Tensor:
        """Rows [r0, r1) of the float32 weight (all rows by default)."""
        r1 = self.out_features if r1 is None else r1
        kern = load_kernels()
        if kern is not None:
            return kern.dequant(self.codes, self.scale, self.min, self.bits, self.block, r0, r1)
        if r0 == 0 and r1 == self.out_features:
            return dequantize_packed(self.packed())
        # only the band's rows: dequantizing the whole matrix for each band made every
        # product without the kernel cost (bands) × (the whole matrix): 0.5 tok/s on SmolLM2
        return dequantize_packed(self.packed(torch.arange(r0, r1)))

    def weight_nbytes(self) -> int:
        return self.packed().nbytes()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, k = x.shape  # (..., K)
        if k != self.in_features:
            raise ValueError(f"QuantLinear expects {self.in_features} input features, got {k}")
        x2 = x.reshape(-1, k)  # (M, K)
        if x2.dtype != torch.float32:  # (skipping a no-op .float(): 200 calls per decode step)
            x2 = x2.float()
        if torch.compiler.is_compiling():  # one opaque graph node (clearlm.quant.ops)
            y = compiled_qmm(x2, self.codes, self.scale, self.min, self.bits, self.block,
                             self.int8) if x2.shape[0] <= SMALL_M else None
            if y is not None and self.bias is not None:
                y = y + self.bias
        else:
            y = None
            if x2.shape[0] <= SMALL_M and load_kernels() is not None:
                # the buffers read from the dict: nn.Module.__getattr__ costs ~0.5 µs per read,
                # five reads per call, ~200 calls per decode step (SmolLM2)
                buf = self._buffers
                y = qmm_eager(x2, buf["codes"], buf["scale"], buf["min"], self.bits, self.block,
                              self.int8)  # (M, N)
                if buf["bias"] is not None:
                    y += buf["bias"]
        if y is None:
            y = self._chunked(x2)
        y = y.reshape(*lead, self.out_features)  # (..., N)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _chunked(self, x2: torch.Tensor) -> torch.Tensor:
        """Dequantize a band of output rows at a time and use float32 matmul: (M, K) -> (M, N).
        The N rows are cut into the fewest bands of about CHUNK_ELEMS values (equal rows, rounded
        up to whole BAND_ROWS; the last band takes what is left)."""
        n = self.out_features
        rows = band_rows(n, self.in_features)
        if rows >= n:
            return F.linear(x2, self.dequantized(), self.bias)
        y = x2.new_empty(x2.shape[0], n)  # (M, N)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            w_t = self.dequantized(r0, r1).t()  # (K, r1 - r0)
            band = y[:, r0:r1]  # (M, r1 - r0), rows N apart: the product is written in place
            if self.bias is None:  # (F.linear's own computation, without a copy into y)
                torch.mm(x2, w_t, out=band)
            else:
                torch.addmm(self.bias[r0:r1], x2, w_t, out=band)
        return y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtype={self.qtype}, bias={self.bias is not None}, int8={self.int8}")


def set_int8_activations(model: torch.nn.Module, on: bool = True) -> int:
    """Switch every QuantLinear of `model` to int8-rounded activations (or back to exact float32
    activations with on=False) for decode-sized calls; returns how many layers it set. Has no
    effect where the int8 kernel is unavailable (:func:`clearlm.quant.ops.int8_available`)."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    for m in layers:
        m.int8 = bool(on)
    return len(layers)
