"""Write a copy of a GGUF whose matrices are requantized to a K-quant or i-quant, to measure
clearlm's compact formats on a real model when no such file is at hand (no llama-quantize here).

    python bench/requantize.py IN.gguf OUT.gguf TYPE   TYPE: Q2_K Q3_K Q5_K IQ4_XS IQ4_NL Q8_0 Q4_0

Every 2-d tensor of a block type is dequantized (gguf.quants) and written as TYPE where its rows
are whole 256-value blocks, else as the type llama.cpp falls back to for such rows
(llama-quant.cpp: Q2_K, Q3_K, IQ4_XS → IQ4_NL; Q5_K → Q5_1): for SmolLM2-135M (d_model 576)
only ffn_down is a K-quant, the rest IQ4_NL or Q5_1, as in the files llama.cpp writes. Other
tensors and all metadata are copied. Q8_0 and Q4_0 (gguf.quants' own quantizers, blocks of 32)
serve every matrix: a second quantization of a file to compare with it (``clearlm diff``).

The quantizers are the plain ones (each sub-block's range, rounded codes; IQ4 codes the nearest
codebook value), not llama.cpp's error-minimising searches: valid blocks of every field, fine for
memory, speed and compact-vs-float32 comparisons on the same file, a little worse in quality.
Layouts: ggml-common.h (block_q2_K, block_q3_K, block_q5_K, block_iq4_nl, block_iq4_xs).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

Q = GGMLQuantizationType
FALLBACK = {Q.Q2_K: Q.IQ4_NL, Q.Q3_K: Q.IQ4_NL, Q.IQ4_XS: Q.IQ4_NL, Q.Q5_K: Q.Q5_1}
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                   np.float32)


def f16(a: np.ndarray) -> np.ndarray:
    """float16 values as little-endian bytes: (n,) → (n, 2) uint8."""
    return a.astype("<f2").view(np.uint8).reshape(-1, 2)


def ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


def range_codes(x: np.ndarray, levels: int, sub_bits: int):
    """Asymmetric sub-blocks x (n, S, L): codes 0..levels-1 with two-level scales (Q2_K, Q5_K).
    Returns d, dmin (n,) float16, sub-scales and sub-mins (n, S) uint8, codes (n, S, L)."""
    top = 2**sub_bits - 1
    lo = np.minimum(x.min(-1), 0)
    scale, mins = (x.max(-1) - lo) / (levels - 1), -lo  # (n, S)
    d = (scale.max(-1) / top).astype(np.float16)
    dmin = (mins.max(-1) / top).astype(np.float16)
    sc = np.clip(np.rint(ratio(scale, d.astype(np.float32)[:, None])), 0, top)
    m = np.clip(np.rint(ratio(mins, dmin.astype(np.float32)[:, None])), 0, top)
    dl = d.astype(np.float32)[:, None] * sc
    ml = dmin.astype(np.float32)[:, None] * m
    q = np.clip(np.rint(ratio(x + ml[..., None], np.broadcast_to(dl[..., None], x.shape))), 0,
                levels - 1)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def two_bit_planes(q: np.ndarray) -> np.ndarray:
    """(n, 256) 2-bit codes → (n, 64) bytes: value v at byte 32 (v // 128) + v % 32, bits
    2 ((v % 128) // 32) (Q2_K's and Q3_K's qs)."""
    q = q.reshape(-1, 2, 4, 32)  # (n, half, shift, byte)
    return (q << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]).sum(2, dtype=np.uint8
                                                                                ).reshape(-1, 64)


def q2_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = range_codes(x.reshape(-1, 16, 16), 4, 4)
    return np.hstack([sc | (m << 4), two_bit_planes(q.reshape(-1, 256)), f16(d), f16(dmin)])


def q3_k(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 16, 16)  # (n, sub-block, value)
    amax = np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]  # signed max
    scale = amax / -4  # the largest value → code -4
    d = (np.abs(scale).max(-1) / 32).astype(np.float16)
    sc = np.clip(np.rint(ratio(scale, d.astype(np.float32)[:, None])), -32, 31)
    dl = (d.astype(np.float32)[:, None] * sc)[..., None]
    q = (np.clip(np.rint(ratio(x, np.broadcast_to(dl, x.shape))), -4, 3) + 4).astype(np.uint8)
    q = q.reshape(-1, 256)
    hmask = ((q >> 2) & 1).reshape(-1, 8, 32) << np.arange(8, dtype=np.uint8)[None, :, None]
    s = (sc + 32).astype(np.uint8)  # (n, 16), 6 bits
    scales = np.zeros((x.shape[0], 12), np.uint8)
    scales[:, :8] = (s[:, :8] & 0x0F) | ((s[:, 8:] & 0x0F) << 4)
    hi = (s >> 4).reshape(-1, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None]
    scales[:, 8:] = hi.sum(1, dtype=np.uint8)
    return np.hstack([hmask.sum(1, dtype=np.uint8), two_bit_planes(q & 3), scales, f16(d)])


def q5_k(x: np.ndarray) -> np.ndarray:
    d, dmin, sc, m, q = range_codes(x.reshape(-1, 8, 32), 32, 6)
    scales = np.zeros((sc.shape[0], 12), np.uint8)  # inverse of gguf's Q4_K.get_scale_min
    scales[:, :4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    scales[:, 8:] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1, dtype=np.uint8)
    lo = (q & 0x0F).reshape(-1, 4, 2, 32)
    qs = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(-1, 128)
    return np.hstack([f16(d), f16(dmin), scales, qh, qs])


def iq4_codes(x: np.ndarray, dl: np.ndarray) -> np.ndarray:
    """The nearest codebook entry to x / dl: (..., 32) → (..., 32) codes 0..15."""
    t = ratio(x, np.broadcast_to(dl, x.shape))
    return np.abs(t[..., None] - KVALUES).argmin(-1).astype(np.uint8)


def nibbles(q: np.ndarray) -> np.ndarray:
    """(..., 32) codes → (..., 16) bytes: code l low, code l + 16 high."""
    return q[..., :16] | (q[..., 16:] << 4)


def signed_max(x: np.ndarray) -> np.ndarray:
    return np.take_along_axis(x, np.abs(x).argmax(-1)[..., None], -1)[..., 0]


def iq4_nl(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 32)
    d = (signed_max(x) / -127).astype(np.float16)
    q = iq4_codes(x, d.astype(np.float32)[:, None])
    return np.hstack([f16(d), nibbles(q)])


def iq4_xs(x: np.ndarray) -> np.ndarray:
    x = x.reshape(-1, 8, 32)
    dj = signed_max(x) / -127  # (n, 8)
    d = (np.abs(dj).max(-1) / 32).astype(np.float16)
    sc = np.clip(np.rint(ratio(dj, d.astype(np.float32)[:, None])), -32, 31)
    q = iq4_codes(x, (d.astype(np.float32)[:, None] * sc)[..., None])  # (n, 8, 32)
    ls = (sc + 32).astype(np.uint16)
    sh = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(-1, dtype=np.uint16)
    sl = (ls[:, 0::2] & 0x0F) | ((ls[:, 1::2] & 0x0F) << 4)
    return np.hstack([f16(d), sh.astype("<u2").view(np.uint8).reshape(-1, 2),
                      sl.astype(np.uint8), nibbles(q).reshape(-1, 128)])


PLAIN = ["Q8_0", "Q4_0"]  # quantized by gguf.quants itself (any row of whole 32-value blocks)
QUANTIZERS = {Q.Q2_K: q2_k, Q.Q3_K: q3_k, Q.Q5_K: q5_k, Q.IQ4_NL: iq4_nl, Q.IQ4_XS: iq4_xs}


def requantize(w: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """(rows, K) float32 → (rows, bytes per row) uint8 blocks of qtype."""
    if qtype not in QUANTIZERS:
        return quantize(w, qtype)
    return QUANTIZERS[qtype](w.astype(np.float32)).reshape(w.shape[0], -1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("type", choices=[q.name for q in QUANTIZERS] + PLAIN)
    a = ap.parse_args()
    target = Q[a.type]
    r = GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(a.dst, arch)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    counts: dict[str, int] = {}
    for t in r.tensors:
        data, kind = t.data, t.tensor_type
        if len(t.shape) == 2 and kind not in (Q.F32, Q.F16):
            k = int(t.shape[0])
            kind = target if k % 256 == 0 else FALLBACK.get(target, target)
            data = requantize(dequantize(t.data, t.tensor_type).reshape(-1, k), kind)
            back = dequantize(data, kind).reshape(-1, k)
            assert np.isfinite(back).all(), t.name
        counts[kind.name] = counts.get(kind.name, 0) + 1
        w.add_tensor(t.name, data, raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.dst}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
