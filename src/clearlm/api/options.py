"""The options a load takes besides the path: the parameter dtype and the weight mode.

Shared by :func:`clearlm.api.model.load` and the CLI (cli/loader.py), so both refuse the same
values
with the same typed error (SamplingParamsError, exit code 7, as for every bad setting).
"""

from __future__ import annotations

import warnings

import torch

from clearlm.errors import SamplingParamsError

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """ "float32" / "bfloat16" / "float16" (or the torch dtype itself) → torch dtype.

    Raises SamplingParamsError for anything else."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise SamplingParamsError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")


WEIGHTS = ("compact", "float32")


def parse_weights(
    weights: str | None, dtype: torch.dtype, device: torch.device | None = None, ranks: int = 1
) -> str:
    """How a GGUF's block-quantized matrices are held: "compact" (packed as in the file, the
    default with float32 on the CPU in one process) or "float32" (dequantized, the exact
    reference path; the default with bfloat16/float16, on another device, or split over
    ranks, where the compact layers do not run).

    Raises SamplingParamsError for another value, or "compact" with a half dtype, a non-CPU
    device or more than one rank."""
    on_cpu = device is None or device.type == "cpu"
    if weights is None:
        return "compact" if dtype == torch.float32 and on_cpu and ranks == 1 else "float32"
    if not isinstance(weights, str) or weights not in WEIGHTS:
        raise SamplingParamsError(f"unknown weights {weights!r}; use compact or float32")
    if weights == "compact" and dtype != torch.float32:
        raise SamplingParamsError(
            "compact weights compute in float32; use dtype float32, or weights float32 "
            "for bfloat16/float16"
        )
    if weights == "compact" and not on_cpu:
        raise SamplingParamsError(
            f"compact weights run on the CPU (their kernel is C++); use weights float32 on {device}"
        )
    if weights == "compact" and ranks > 1:
        raise SamplingParamsError(
            "compact weights are not split over ranks; use weights float32 with tensor or "
            "pipeline parallel"
        )
    return weights


ACTIVATIONS = ("float32", "int8")


def parse_activations(
    activations: str | None, weights: str, dtype: torch.dtype = torch.float32
) -> str:
    """How compact layers take their inputs in decode-sized products: "float32" (exact, the
    default) or "int8" (rounded per block of 32 values, as llama.cpp's Q8 activations:
    clearlm.quant.linear.set_int8_activations; faster decode, not exact, bounded in
    tests/quant/test_quant_i8.py). ``weights`` is the mode parse_weights chose, ``dtype`` the
    parameter dtype (named in the error when it is what ruled compact weights out).

    None is "float32". Raises SamplingParamsError for another value, or "int8" with float32
    weights."""
    if activations is None:
        return "float32"
    if not isinstance(activations, str) or activations not in ACTIVATIONS:
        raise SamplingParamsError(f"unknown activations {activations!r}; use float32 or int8")
    if activations == "int8" and weights != "compact":
        fix = (
            "use dtype float32 (compact weights compute in float32)"
            if dtype != torch.float32
            else "use weights compact (the default for a quantized GGUF in float32 on the CPU)"
        )
        raise SamplingParamsError(f"int8 activations are a compact-weight mode; {fix}")
    return activations


def use_int8_activations(model: torch.nn.Module, source: str) -> str:
    """Switch the compact layers to int8 activations (see :func:`load`); returns the mode that
    took effect: "int8", or "float32" where the int8 kernel is not built (with a warning).

    Raises SamplingParamsError when the model has no compact layer (a Hugging Face folder,
    F32/F16 tensors)."""
    from clearlm.quant.linear import set_int8_activations
    from clearlm.quant.ops import int8_available

    if set_int8_activations(model) == 0:
        raise SamplingParamsError(
            f"int8 activations apply to compact (block-quantized) weights; {source} has none"
        )
    if not int8_available():
        warnings.warn("clearlm: int8 activations need the int8 kernel (AVX-512 VNNI or "
                      "AVX2), which is not built here; decode stays exact float32", stacklevel=3)
        return "float32"
    return "int8"
