"""Load a model with its weights either dequantized to float32 or kept compact.

``load_weights(path, "float32" | "compact")`` is the one place the benchmark
(bench/llamacpp.py) and the distance measurements (clearlm.quant.distance, its tests) get a
compact model. When ``clearlm.load`` accepts ``weights=`` it is used as is; otherwise the
float32 model is loaded and its block-quantized linear and embedding layers are swapped for
compact ones from the same file (:func:`clearlm.quant.swap.quantize_model`), which is what
``weights="compact"`` does. Both give modules that reproduce the GGUF's dequantized values.
"""

from __future__ import annotations

import inspect
import os

import clearlm
from clearlm.api import Model
from clearlm.errors import SamplingParamsError
from clearlm.loading.gguf import open_gguf

WEIGHT_MODES = ("float32", "compact")


def load_weights(
    model: str | os.PathLike[str] | None, weights: str = "compact", threads: int | None = None
) -> Model:
    """A float32 Model whose weights are float32 ("float32") or compact ("compact").

    model: a GGUF path or an alias (as ``clearlm.load``); "compact" needs a GGUF file.
    Raises SamplingParamsError for another mode, and what ``clearlm.load`` raises."""
    if weights not in WEIGHT_MODES:
        raise SamplingParamsError(
            f"weights must be one of {', '.join(WEIGHT_MODES)}, got {weights!r}"
        )
    if "weights" in inspect.signature(clearlm.load).parameters:
        return clearlm.load(model, threads=threads, weights=weights)  # type: ignore[call-arg]
    loaded = clearlm.load(model, threads=threads)
    if weights == "compact":
        if os.path.isdir(loaded.path):
            raise SamplingParamsError(
                f"weights='compact' needs a GGUF file; {loaded.path} is a folder (use float32)"
            )
        from clearlm.quant.swap import quantize_model

        quantize_model(loaded.transformer, open_gguf(loaded.path), loaded.config)
    return loaded
