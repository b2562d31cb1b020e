"""Read a GGUF file: metadata, then tensors renamed to our parameter names and dequantized.

Loading is a chain of small pure steps (style.md): open → read metadata → rename through the
family's table (``GGUFArch.tensors``) → dequantize with the ``gguf`` library → fix the layout
(llama.cpp's RoPE rows, Gemma's 1 + w norms: families/transforms.py) → the family's ``convert``.
The file format is specified at https://github.com/ggml-org/ggml/blob/master/docs/gguf.md.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError, ModelNotFoundError, UnsupportedModelError
from clearlm.families import GGUFArch, gguf_arch
from clearlm.families.transforms import unpermute_qk, unshift_norm
from clearlm.loading.gguf_config import config_from_gguf
from clearlm.loading.gguf_file import BlockShapeError, GGUFFile, GGUFFormatError
from clearlm.loading.load import TensorInfo

GGUF_MAGIC = b"GGUF"
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's RoPE frequency factors, not a parameter

# Tensor types we dequantize (through gguf.quants): every type llama.cpp's llama-quantize
# writes, the i-quants' lattice codebooks (IQ1 .. IQ3) and the ternary TQ1_0 / TQ2_0 included;
# anything else (F64, the integer types, types a newer gguf adds) is refused with its name.
SUPPORTED_TENSOR_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in ("F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS "
                 "IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S TQ1_0 TQ2_0").split()
)


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF file (memory-mapped; metadata and tensor table read, no tensor copied).

    Raises:
        ModelNotFoundError: the path does not exist or is a directory.
        InvalidModelFileError: the file is not GGUF, or is truncated or corrupt.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelNotFoundError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise ModelNotFoundError(f"{path} is a directory; pass the path of a .gguf file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise InvalidModelFileError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')"
        )
    try:
        return GGUFFile(path)
    except BlockShapeError as e:
        raise InvalidModelFileError(f"{path}: {e}") from None
    except (ValueError, OSError) as e:  # GGUFFormatError is a ValueError
        why = str(e) if isinstance(e, GGUFFormatError) else f"{type(e).__name__}: {e}"
        raise InvalidModelFileError(
            f"{path} is a truncated or corrupt GGUF file ({why}); download it again"
        ) from None


def read_metadata(reader: GGUFFile) -> dict[str, Any]:
    """All key/value metadata of the file as plain Python values (str, int, float, bool, list)."""
    return dict(reader.metadata)


def read_config(reader: GGUFFile, metadata: dict[str, Any], source: str) -> ModelConfig:
    """The file's ModelConfig: its metadata, its tensor names (a missing output.weight means a
    tied head) and the values of llama.cpp's ``rope_freqs.weight`` when present (RoPE
    frequency factors, d/2 float32: Llama 3.1+ GGUFs carry their rope scaling there).

    Raises:
        UnsupportedModelError, InvalidModelFileError: see config_from_gguf.
    """
    names = {t.name for t in reader.tensors}
    freqs = None
    for t in reader.tensors:
        if t.name == ROPE_FREQS:
            values = dequantize(t.data, t.tensor_type).reshape(-1)
            freqs = tuple(float(v) for v in values)
    return config_from_gguf(metadata, names, source, freqs)


def tensor_infos(reader: GGUFFile) -> list[TensorInfo]:
    """The file's tensors as stored: name, type, shape in (out, in) order (nothing is read)."""
    return [TensorInfo(t.name, t.tensor_type.name, _stored_shape(t)) for t in reader.tensors]


def gguf_to_ours(name: str, table: dict[str, str], n_layers: int) -> str | None:
    """Map a llama.cpp tensor name to ours through an architecture's table (None if unknown)."""
    if name in table:
        return table[name]
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_layers:
        pattern = "blk.{i}." + ".".join(parts[2:])
        if pattern in table:
            return table[pattern].replace("{i}", parts[1])
    return None


def load_tensors(
    reader: GGUFFile, config: ModelConfig, dtype: torch.dtype = torch.float32, source: str = ""
) -> dict[str, torch.Tensor]:
    """Dequantize every tensor of the file into our parameter names, fix llama.cpp's layouts,
    then apply the architecture's ``convert`` (GPT-2: split the fused attn_qkv).

    Args:
        reader: an open GGUF file.
        config: the model's config (for head counts and the tied-head decision).
        dtype: the torch dtype of the returned tensors (dequantization itself is float32).
        source: the file's name, used in error messages.

    Returns:
        name → tensor, shapes as nn.Linear stores them: (out_features, in_features).

    Raises:
        UnsupportedModelError: a tensor uses a type outside SUPPORTED_TENSOR_TYPES, or the file
            holds a tensor name its architecture's table does not know (``rope_freqs.weight``
            is known when read_config took it into config.rope_scaling).
        InvalidModelFileError: a tensor's data is truncated.
    """
    arch = gguf_arch(config.architecture, source)
    state: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        ours = our_name(t, arch, config, source)
        if ours is None:
            continue  # rope_freqs.weight: already in the config (read_config), not a parameter
        w = dequantize_tensor(t, source)  # (out, in) float32
        if arch.unpermute_qk:
            w = unpermute_qk(ours, w, config)
        w = unshift_norm(ours, w, arch.norm_shift)  # Gemma GGUFs store 1 + w
        state[ours] = to_torch(w, dtype)
        reader.release(t.data_offset, t.n_bytes)  # copied: its mapped pages can go
    return arch.convert(state, config)


def _stored_shape(t: Any) -> tuple[int, ...]:
    """GGUF lists shapes innermost-first ([n_in, n_out]); ours are [n_out, n_in]."""
    return tuple(int(d) for d in reversed(t.shape))


def our_name(t: Any, arch: GGUFArch, config: ModelConfig, source: str) -> str | None:
    """Our name for tensor ``t``; None for ``rope_freqs.weight`` once taken into the config.

    Raises:
        UnsupportedModelError: a name the family's table does not know.
    """
    ours = gguf_to_ours(t.name, arch.tensors, config.n_layers)
    if ours is None:
        scaling = config.rope_scaling
        if t.name == ROPE_FREQS and scaling is not None and scaling.kind == "factors":
            return None
        raise UnsupportedModelError(
            f"{source}: unknown tensor {t.name!r} for {config.architecture}"
        )
    return ours


def dequantize_tensor(t: Any, source: str) -> np.ndarray:
    """The tensor's values in float32, shape (out, in).

    Raises:
        UnsupportedModelError: a type outside SUPPORTED_TENSOR_TYPES.
        InvalidModelFileError: the data is truncated.
    """
    if t.tensor_type not in SUPPORTED_TENSOR_TYPES:
        raise UnsupportedModelError(
            f"{source}: tensor {t.name} has type {t.tensor_type.name}, which clearlm does not "
            "dequantize; supported: " + ", ".join(sorted(q.name for q in SUPPORTED_TENSOR_TYPES))
        )
    try:
        # garbage bytes make NaN / inf scales: numpy's RuntimeWarnings about them would print
        # before the one-line error that a file that wrong ends in (shapes, NaN logits)
        with np.errstate(invalid="ignore", over="ignore"):
            return dequantize(t.data, t.tensor_type).reshape(_stored_shape(t))
    except ValueError as e:
        raise InvalidModelFileError(f"{source}: tensor {t.name} is truncated ({e})") from None


def to_torch(w: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    w = np.ascontiguousarray(w, dtype=np.float32)
    if not w.flags.writeable:  # F32 tensors come straight from the read-only memory map
        w = w.copy()
    return torch.from_numpy(w).to(dtype)
