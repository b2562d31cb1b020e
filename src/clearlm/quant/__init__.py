"""Compact block-quantized weights: GGUF blocks repacked without dequantizing, at the file's bytes
(pack.py, fields.py, tiles.py, kheads.py: K-quants' heads and field codes, iq4.py: IQ4's table
codes), a C++ GEMV kernel that reads them (csrc/qgemv.cpp, built by kernels.py / build.py), the
int8-activation products (ops.py), fused projections (fuse.py) and the modules that use them,
QuantLinear (linear.py) and QuantEmbedding (embedding.py); F16 / BF16 matrices kept 16-bit,
HalfLinear and HalfEmbedding (half.py, with csrc/qgemv_half.cpp).

Speed beside the readable path: the model's nn.Linear is replaced from outside
(:mod:`clearlm.loading.compact`), and QuantLinear's products equal F.linear on the dequantized
weights within the bounds the tests hold. May import ``clearlm.model`` (for its module
conventions), ``clearlm.store`` (the kernel cache folder) and ``clearlm.errors``; it knows
nothing of files or families.
"""

from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import SUPPORTED, Packed, UnsupportedQuantError, pack_blocks

__all__ = ["SUPPORTED", "Packed", "QuantLinear", "UnsupportedQuantError", "pack_blocks"]
