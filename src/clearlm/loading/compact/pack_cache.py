"""A packed copy of a GGUF's compact matrices, kept on disk and memory-mapped by later loads.

Packing (loading/compact/from_file.py) rebuilds every block-quantized matrix into the kernel's
layout:
Qwen2.5-Coder-0.5B's 460 MB of Q8_0 / Q5_0 / Q4_K / Q6_K blocks take 0.45-0.7 s of CPU time
(one thread) on every load. The first compact load of a file writes what it packed to
``<cache>/packed/<file stem>-<key>.safetensors``; a later load of the same, unchanged file maps
that copy (``safetensors.safe_open``: tensors are views of the mapped file, pages read on first
touch, private copy-on-write) instead of packing: the same bytes, no CPU time, no second copy in
memory. The price is disk: about 1.2× the file's quantized bytes per model (pack.py's table).

The key (16 hex digits of a SHA-256) covers the GGUF's real path, size, modification and
status-change times, inode and device, and the code that decides the packed bytes (pack.py,
from_file.py, tiles.py, fields.py, this file, loading/*.py, families/*.py) and what the kernel
build makes of it (rows per tile, 5-bit bit fields: an AVX2 build, an AVX-512 build and a process
without the kernel each keep their own copy): editing any of them, or replacing or rewriting the
file (even with its mtime put back), makes a new key. Each copy records the real path it was
made from and that layout: writing one deletes the older copies of that file of the same layout,
the copies of files that are gone and the temporary files of killed writers
(clearlm.store.cache_dir.remove_stale_copies). A copy is written to a temporary name and renamed,
so a
crash leaves no partial copy under the real name; a copy that does not open, or whose tensor
list, shapes or dtypes differ from what the load asks for, is ignored (a one-line warning) and
the load packs as usual. The bytes themselves are not checked (a checksum would cost about the
time the copy saves): a copy edited by hand under a valid header is trusted.

``CLEARLM_PACK_CACHE=0`` turns it off (nothing read or written); the test suite does so except
in tests/loading/test_pack_cache.py. Format: safetensors (huggingface/safetensors docs), written
here a
tensor at a time (``save_file`` first builds the whole file's bytes in memory: +1.2× the weights
at the load's peak) with every tensor 64-byte aligned by explicit padding tensors.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import warnings
from pathlib import Path

import torch
from gguf import GGML_QUANT_SIZES
from safetensors import safe_open

from clearlm.errors import SamplingParamsError
from clearlm.loading.compact.from_file import row_layout, tile_layout
from clearlm.loading.gguf_file import GGUFTensor
from clearlm.quant.fields import preferred
from clearlm.quant.fuse import join_rows
from clearlm.quant.pack import SUPPORTED, Packed
from clearlm.quant.tiles import tile_size
from clearlm.store.cache_dir import copy_metadata, packed_copies, packed_dir, remove_stale_copies

ENV = "CLEARLM_PACK_CACHE"
ALIGN = 64  # bytes: every tensor starts on a cache line
_DTYPES = {torch.uint8: "U8", torch.int8: "I8", torch.float16: "F16", torch.float32: "F32"}
_PKG = Path(__file__).resolve().parents[2]  # src/clearlm
# the code that decides what is packed and how: layouts, row un-permutation, which tensors
# (the families' tables and flags), how they are grouped
_KEY_CODE = (*(_PKG / "quant" / f for f in ("pack.py", "tiles.py", "fields.py", "iq4.py",
                                            "kheads.py", "lattice.py")),
             *sorted((_PKG / "loading" / "compact").glob("*.py")),
             *sorted((_PKG / "loading").glob("*.py")),
             *sorted((_PKG / "families").glob("*.py")))
_ON, _OFF = ("1", "on", "yes", "true", ""), ("0", "off", "no", "false")

# a packing job: the Packed of its members, in order (quant/from_file.pack_group)
Job = list[Packed]


def enabled() -> bool:
    """``$CLEARLM_PACK_CACHE``: 0, off, no or false (any case) → False; unset, empty, 1, on,
    yes or true → True. Raises SamplingParamsError for any other value."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value not in _ON + _OFF:
        raise SamplingParamsError(
            f"{ENV} must be 1/on/yes/true or 0/off/no/false, got {os.environ[ENV]!r}"
        )
    return value in _ON


def cache_path(gguf: str | os.PathLike[str]) -> Path:
    """Where the packed copy of this GGUF file (as it is now) lives.

    Raises OSError when the file cannot be stat'ed."""
    real = os.path.realpath(gguf)
    st = os.stat(real)
    # ctime too: rewriting a file in place keeps its inode, and `touch -r` can restore mtime
    ident = (real, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    h = hashlib.sha256("\0".join(map(str, ident)).encode())
    h.update(_code_digest())
    h.update(_layouts().encode())
    return packed_dir() / f"{Path(real).stem}-{h.hexdigest()[:16]}.safetensors"


def _layouts() -> str:
    """What this process's kernel build makes packing lay out (rows per tile for each code
    layout, 5-bit codes as bit fields or not): a process with an AVX2 build, one with an
    AVX-512 build and one without the kernel pack differently, so each keeps its own copy
    instead of rejecting and rewriting the others' at every load."""
    rows = (row_layout(q, GGML_QUANT_SIZES[q][0]) for q in SUPPORTED)  # one block of each
    codes = sorted({(r.bits, r.block) for r in rows})  # pack.py's code layouts
    return f"tiles {[(b, bs, tile_size(b, bs)) for b, bs in codes]} fields {preferred()}"


@functools.cache
def _code_digest() -> bytes:
    """SHA-256 of the _KEY_CODE sources, read once per process (read and write both ask)."""
    h = hashlib.sha256()
    for f in _KEY_CODE:
        h.update(f.read_bytes())
    return h.digest()


def read(gguf: str | os.PathLike[str], tensors: list[list[GGUFTensor]],
         tiles: list[list[int]]) -> list[Job] | None:
    """The packed jobs for ``tensors`` (each job's GGUF tensors, in order) from the cached copy,
    or None when there is none, it is off, or it does not match them (then a warning): other
    names, or a member whose format, dtypes, shapes or rows per tile (``tiles``, the same
    nesting as ``tensors``: 1 or quant/tiles.tile_size's, what this load plans) are not what packing
    gives."""
    if not enabled():
        return None
    name = Path(gguf).name
    try:
        path = cache_path(gguf)
        if not path.is_file():
            return None
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("clearlm.jobs", "null"))
            names = [[t.name for t in job] for job in tensors]
            if not isinstance(meta, list) or not all(isinstance(j, dict) and "names" in j
                                                     for j in meta):
                raise ValueError("its tensor list is missing or unreadable")
            if [j["names"] for j in meta] != names:
                raise ValueError("its tensor list differs from this load's")
            jobs = [_job(f, i, j) for i, j in enumerate(meta)]
        for job, members, planned in zip(jobs, tensors, tiles, strict=True):
            for p, t, tile in zip(job, members, planned, strict=True):
                if not _fits(p, t, tile):
                    raise ValueError(f"{t.name} is not laid out as packing lays it out")
        return jobs
    except Exception as e:  # noqa: BLE001 - any bad copy: pack as if there were none
        why = str(e) if isinstance(e, ValueError) else f"unreadable: {type(e).__name__}: {e}"
        warnings.warn(f"clearlm: the packed copy of {name} was not used ({why}); packing it",
                      stacklevel=2)
        return None


def _fits(p: Packed, t: GGUFTensor, tile: int) -> bool:
    """Has ``p`` the format, dtypes and shapes that packing the (N, K) tensor ``t`` in tiles of
    ``tile`` rows gives? (A copy whose tiles differ from the plan's would compute other rows.)"""
    k, n = t.shape  # GGUF order: innermost first
    want = row_layout(t.tensor_type, k)
    if (p.bits, p.block, p.qtype) != (want.bits, want.block, want.qtype) or p.shape != (n, k):
        return False
    if p.tile != tile:
        return False
    if p.tile != 1:  # row tiles (quant/tiles.py): the layout of one tile of zero rows
        want = tile_layout(t.tensor_type, k, p.tile)
    n //= p.tile
    pairs = [(p.codes, want.codes), (p.scale, want.scale)]
    if (p.min is None) != (want.min is None):
        return False
    if p.min is not None:
        pairs.append((p.min, want.min))
    return all(a.dtype == b.dtype and a.shape == (n, *b.shape[1:]) for a, b in pairs)


def _job(f, i: int, meta: dict) -> Job:
    """Job i's Packed list: views of one buffer per kind when the job was packed shared."""
    def get(name: str) -> torch.Tensor | None:
        return f.get_tensor(f"{i}.{name}") if f"{i}.{name}" in meta["tensors"] else None

    out, kinds, lead = [], meta["kinds"], meta["shared"]  # the first `lead` share buffers
    if lead:
        codes, scale, mn, r0 = get("codes"), get("scale"), get("min"), 0
        for rows, kind in zip(meta["lead"][:lead], kinds, strict=False):
            band = slice(r0, r0 + rows)  # rows, or tiles of rows
            out.append(Packed(codes[band], scale[band], None if mn is None else mn[band], *kind))
            r0 += rows
    for m in range(lead, len(kinds)):
        out.append(Packed(get(f"{m}.codes"), get(f"{m}.scale"), get(f"{m}.min"), *kinds[m]))
    return out


def write(gguf: str | os.PathLike[str], tensors: list[list[GGUFTensor]], jobs: list[Job]) -> None:
    """Save the packed ``jobs`` (of these GGUF ``tensors``) as this file's cached copy and
    delete older copies of the same file name. Never raises: a failure is one warning line."""
    if not enabled():
        return
    try:
        path = cache_path(gguf)
        path.parent.mkdir(parents=True, exist_ok=True)
        saved: dict[str, torch.Tensor] = {}
        meta = []
        for i, (job, members) in enumerate(zip(jobs, tensors, strict=True)):
            shared = _leading_shared(job)
            for kind in ("codes", "scale", "min"):
                ts = [getattr(p, kind) for p in job]
                if shared and ts[0] is not None:
                    saved[f"{i}.{kind}"] = join_rows(ts[:shared])  # a view: bands of one buffer
                saved.update({f"{i}.{m}.{kind}": t for m, t in enumerate(ts)
                              if m >= shared and t is not None})
            meta.append({"names": [t.name for t in members],
                         "lead": [p.codes.shape[0] for p in job],  # rows, or tiles of rows
                         "shared": shared,
                         "kinds": [[p.bits, p.block, p.qtype] for p in job],
                         "tensors": [k for k in saved if k.startswith(f"{i}.")]})
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            layout = _layouts()
            source = {"clearlm.source": os.path.realpath(gguf),  # whose copy (cache.py)
                      "clearlm.layout": layout}  # for which kernel build
            _save(saved, {"clearlm.jobs": json.dumps(meta), **source}, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        for old in packed_copies(gguf, path.parent.parent):  # this file's older versions, of
            # this layout (or none named: older clearlm); another build's copy stays its own
            if old != path and copy_metadata(old, "clearlm.layout") in (None, layout):
                old.unlink(missing_ok=True)
        remove_stale_copies(path.parent.parent)  # copies of files gone, killed writers' .tmp
    except Exception as e:  # noqa: BLE001 - a cache that cannot be written costs only speed
        warnings.warn(f"clearlm: could not keep a packed copy of {Path(gguf).name} ({e}); "
                      f"loads pack it each time ({ENV}=0 stops trying)", stacklevel=2)


def _leading_shared(job: Job) -> int:
    """How many leading members' codes are consecutive row bands of one buffer (pack_group's
    shared form); 0 when fewer than two are."""
    at = job[0].codes
    end, n = at.storage_offset() + at.numel(), 1
    for p in job[1:]:
        same = p.codes.untyped_storage().data_ptr() == at.untyped_storage().data_ptr()
        if not same or p.codes.storage_offset() != end:
            break
        end += p.codes.numel()
        n += 1
    return n if n > 1 else 0


def _save(tensors: dict[str, torch.Tensor], metadata: dict[str, str], path: Path) -> None:
    """Write a safetensors file a tensor at a time: an 8-byte little-endian header length, the
    JSON header (dtype, shape, data_offsets of each tensor; ``__metadata__``), then the bytes.
    Padding tensors (``__pad<i>``, uint8) keep every tensor ALIGN-byte aligned, since the format
    allows no holes between tensors."""
    header: dict[str, object] = {"__metadata__": metadata}
    order, at = [], 0
    for name, t in tensors.items():
        if at % ALIGN:
            pad = ALIGN - at % ALIGN
            header[f"__pad{len(order)}"] = {"dtype": "U8", "shape": [pad],
                                             "data_offsets": [at, at + pad]}
            order.append(bytes(pad))
            at += pad
        t = t.contiguous()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + t.nbytes]}
        order.append(t)
        at += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)  # the data starts ALIGN-aligned in the file
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for item in order:
            out.write(item if isinstance(item, bytes) else item.view(torch.uint8).numpy().data)
