"""A GGUF file's metadata and tensor table, read from the memory map in bulk.

Why not ``gguf.GGUFReader``: it builds a numpy view (a ``memmap`` object) for every element of
every metadata array, so a 151,936-token vocabulary plus its 151,387 merges cost 5.8 s of CPU
time to open (Qwen2.5-Coder-0.5B) and Gemma 3's 262,144 tokens 8.6 s, before a weight is read
(measured: 1 thread, ``GGUFReader(path)`` alone). Here numeric arrays are one ``np.frombuffer``
each and a string array is one tight loop of ``struct.unpack_from`` + ``bytes.decode``
(strings carry their own lengths, so their offsets are a sequential scan); the same files open
in about 0.1 s. tests/loading/test_gguf_file.py checks every key, value, tensor and byte against
GGUFReader on the real and the tiny test files.

Layout (ggml's docs/gguf.md, little-endian): magic ``GGUF``, uint32 version (2 or 3), uint64
tensor count, uint64 key/value count; each pair is a string key, a uint32 value type and the
value (a string: uint64 length + UTF-8 bytes; an array: uint32 element type, uint64 count,
elements); then per tensor: name, uint32 n_dims, n_dims × uint64 dims (innermost first),
uint32 type, uint64 offset; the tensor data starts at the next multiple of
``general.alignment`` (default 32).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# value type id → numpy dtype of a scalar (8 = string, 9 = array)
_NUMPY = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
    6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64,
}  # fmt: skip
_STRING, _ARRAY = 8, 9
_PLAIN = {  # tensor types stored as plain numbers: data gets their dtype (as GGUFReader does)
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}  # fmt: skip
PAGE = mmap.PAGESIZE


class GGUFFormatError(ValueError):
    """The bytes do not follow the GGUF layout (loading/gguf.py names the file and wraps it)."""


class BlockShapeError(GGUFFormatError):
    """A block-quantized tensor whose rows are not whole blocks: written wrong, not damaged in
    transfer, so loading/gguf.py does not suggest downloading it again."""


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the table. ``shape`` is GGUF's order (innermost first), as GGUFReader's;
    ``data`` is a read-only view of the mapped bytes: the numbers for F32/F16/…, else uint8
    (rows, bytes per row); ``data_offset`` / ``n_bytes`` locate it in the file."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GGUFFile:
    """An open GGUF file: ``metadata`` (key → str / int / float / bool / list, the ``GGUF.*``
    header fields left out), ``value_types`` (key → type id), ``tensors``, ``version``, ``path``.

    Raises:
        GGUFFormatError: bad magic or version, truncated header or data, unknown value or
            tensor type, a duplicate key or tensor name, a bad alignment, two tensors whose
            bytes overlap.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse()
        except (struct.error, IndexError):
            # struct.error names buffer offsets; the file's size says the same to a user
            raise GGUFFormatError(
                f"its header ends early: the file has {len(self._map):,} bytes, fewer than the "
                "header describes"
            ) from None

    def _parse(self) -> None:
        buf = self._map
        magic, self.version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF":
            raise GGUFFormatError("GGUF magic invalid")
        if self.version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {self.version} (big-endian?) is not 2 or 3")
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, int] = {}
        pos = 24
        for _ in range(n_kv):
            key, pos = _string(buf, pos, strict=True)
            (vtype,) = struct.unpack_from("<I", buf, pos)
            if key in self.metadata:
                raise GGUFFormatError(f"duplicate key {key!r}")
            self.metadata[key], pos = _value(buf, pos + 4, vtype, strict=True)
            self.value_types[key] = vtype
        infos = []
        for _ in range(n_tensors):
            name, pos = _string(buf, pos, strict=True)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            raw_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            infos.append((name, dims, raw_type, offset))
        align = self.metadata.get("general.alignment", 32)
        if self.value_types.get("general.alignment", 4) != 4 or align <= 0 or align & (align - 1):
            raise GGUFFormatError(f"bad general.alignment {align!r}")
        self.data_offset = pos + (-pos) % align
        self.tensors = [self._tensor(*info) for info in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise GGUFFormatError("duplicate tensor name")
        # each tensor's bytes are its own: a wrong type id or offset that makes two tensors
        # share bytes would otherwise load as numbers, finite or not (a silent wrong answer)
        spans = sorted((t.data_offset, t.data_offset + t.n_bytes, t.name) for t in self.tensors)
        for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
            if start < end:
                raise GGUFFormatError(f"tensors {first} and {second} overlap in the file (its "
                                      "tensor table is corrupt)")

    def _tensor(self, name: str, dims: tuple[int, ...], raw_type: int, offset: int) -> GGUFTensor:
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise GGUFFormatError(f"tensor {name} has unknown type id {raw_type}") from None
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        block, type_size = GGML_QUANT_SIZES[qtype]
        if block > 1 and dims and dims[0] % block:
            raise BlockShapeError(
                f"tensor {name} is {qtype.name} with rows of {dims[0]} values, not a whole "
                f"number of its {block}-value blocks (llama.cpp refuses such a file too); "
                "the file was written wrong: convert the model again")
        n_bytes = n * type_size // block
        start = self.data_offset + offset
        if start + n_bytes > len(self._map):
            raise GGUFFormatError(f"tensor {name} is truncated (file ends before its data)")
        np_dims = tuple(reversed(dims))  # outermost first
        if qtype in _PLAIN:
            data = np.frombuffer(self._map, _PLAIN[qtype], n, start).reshape(np_dims)
        else:  # (rows, bytes per row) as gguf.quants.quant_shape_to_byte_shape
            row = np_dims[-1] // block * type_size if np_dims else n_bytes
            data = np.frombuffer(self._map, np.uint8, n_bytes, start)
            data = data.reshape(*np_dims[:-1], row)
        return GGUFTensor(name, qtype, tuple(int(d) for d in dims), n, n_bytes, start, data)

    def close(self) -> None:
        """Forget the tensor views and unmap the file (once no one else holds a view)."""
        self.tensors = []
        try:
            self._map.close()
        except BufferError:  # a view of the map is still alive elsewhere: it unmaps with it
            pass

    def release(self, start: int, length: int) -> None:
        """Drop the mapped pages of bytes [start, start + length) from this process's memory
        (``MADV_DONTNEED``): a read-only file mapping re-reads them from the page cache if they
        are touched again, so this is always safe, and packed tensors stop counting in RSS."""
        if self._map.closed:
            return
        first = start - start % PAGE
        end = min(len(self._map), start + length)
        if hasattr(self._map, "madvise") and end > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, end - first)


def _string(buf: mmap.mmap, pos: int, strict: bool) -> tuple[str, int]:
    """A uint64-length string at pos → (text, position after it)."""
    (n,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + n
    if end > len(buf):
        raise GGUFFormatError("a string runs past the end of the file")
    raw = buf[pos + 8 : end]
    try:
        return raw.decode("utf-8", "strict" if strict else "replace"), end
    except UnicodeDecodeError:
        raise GGUFFormatError(f"a string is not UTF-8: {raw[:40]!r}") from None


def _value(buf: mmap.mmap, pos: int, vtype: int, strict: bool) -> tuple[Any, int]:
    """A value of type vtype at pos → (Python value, position after it). Arrays become lists
    (of numbers as Python int/float/bool, or strings; an array of arrays, a list of lists)."""
    if vtype in _NUMPY:
        dt = np.dtype(_NUMPY[vtype])
        return np.frombuffer(buf, dt, 1, pos).tolist()[0], pos + dt.itemsize
    if vtype == _STRING:
        return _string(buf, pos, strict)
    if vtype != _ARRAY:
        raise GGUFFormatError(f"unknown value type {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _NUMPY:
        dt = np.dtype(_NUMPY[etype])
        if pos + count * dt.itemsize > len(buf):
            raise GGUFFormatError("an array runs past the end of the file")
        return np.frombuffer(buf, dt, count, pos).tolist(), pos + count * dt.itemsize
    if etype == _STRING:  # the vocabulary: one tight loop, invalid UTF-8 replaced (as before)
        out, unpack, size = [], struct.Struct("<Q").unpack_from, len(buf)
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                raise GGUFFormatError("a string runs past the end of the file")
            out.append(buf[pos : pos + n].decode("utf-8", "replace"))
            pos += n
        return out, pos
    items = []
    for _ in range(count):
        item, pos = _value(buf, pos, etype, strict=False)
        items.append(item)
    return items, pos
