"""Compact block-quantized weights: GGUF blocks repacked without dequantizing (pack.py), a C++
GEMV kernel that reads them (csrc/qgemv.cpp, built by kernels.py) and QuantLinear (linear.py)."""

from clearlm.quant.linear import QuantLinear
from clearlm.quant.pack import SUPPORTED, Packed, UnsupportedQuantError, pack_blocks

__all__ = ["SUPPORTED", "Packed", "QuantLinear", "UnsupportedQuantError", "pack_blocks"]
