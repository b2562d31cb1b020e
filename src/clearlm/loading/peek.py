"""The keys of a GGUF file's metadata, read in a fraction of a second.

The ``gguf`` package's reader builds a numpy view for every element of every array (Gemma 3's
262,144-token vocabulary takes it seconds). A question such as "does this file have a chat
template?" needs only the key names, so :func:`gguf_keys` walks the key/value section with
``struct`` and skips array bodies. Layout (ggml's docs/gguf.md): magic ``GGUF``, uint32 version
(2 or 3), uint64 tensor count, uint64 key/value count; each pair is a uint64-length UTF-8 key, a
uint32 value type, then the value; a string is a uint64 length and bytes; an array is a uint32
element type, a uint64 count and the elements. Little-endian only.
"""

from __future__ import annotations

import mmap
import os
import struct

# value type → size in bytes (fixed-size types only); 8 = string, 9 = array
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _skip(buf: mmap.mmap, pos: int, vtype: int) -> int:
    """The offset just past a value of type vtype that starts at pos."""
    if vtype in _SIZES:
        return pos + _SIZES[vtype]
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == _ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _SIZES:
            return pos + count * _SIZES[etype]
        for _ in range(count):  # strings (or nested arrays) have their own lengths
            pos = _skip(buf, pos, etype)
        return pos
    raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_keys(path: str | os.PathLike[str]) -> set[str] | None:
    """The metadata key names of a GGUF file, or None if it cannot be read this way (not a
    GGUF v2/v3 file, truncated, unknown value type): the full reader then reports the problem."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            magic, version, _, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
            if magic != b"GGUF" or version not in (2, 3):
                return None
            pos, keys = 24, set()
            for _ in range(n_kv):
                (n,) = struct.unpack_from("<Q", buf, pos)
                keys.add(bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", "replace"))
                (vtype,) = struct.unpack_from("<I", buf, pos + 8 + n)
                pos = _skip(buf, pos + 12 + n, vtype)
            return keys
    except (OSError, ValueError, struct.error):
        return None


def has_chat_template(path: str | os.PathLike[str]) -> bool | None:
    """Whether a GGUF file holds a chat template (``tokenizer.chat_template`` or a named
    ``tokenizer.chat_template.NAME``); None when the keys cannot be read."""
    keys = gguf_keys(path)
    if keys is None:
        return None
    return any(
        k == "tokenizer.chat_template" or k.startswith("tokenizer.chat_template.") for k in keys
    )
