"""Decode-sized products (x (1, K) @ W.T; --rows M: x (M, K)) per weight format, against F.linear.

Formats: float32 (``F.linear``); F16 and BF16 kept 16-bit (clearlm.quant.half.HalfLinear: the C++
kernel csrc/qgemv_half.cpp, and its pure-torch fallback, widen + F.linear); torch's own 16-bit
``F.linear`` with x rounded to 16 bits (not exact: shown for speed only, its max |Δ| against
the float32 product on the same weights in the last column); Q8_0, Q4_0, Q4_K, Q6_K, Q3_K, Q2_K,
Q5_K, IQ4_NL and IQ4_XS as a compact load holds them (QuantLinear, row tiles of the kernel's
quant/tiles.tile_size), for the existing formats' speed (Q8_0 and Q4_0 quantized from the
weights by gguf; the others, which gguf-py cannot quantize, are random blocks of the same shape
with small float16 scales: the same bytes to read).

Two settings per shape: "hot", one matrix multiplied again and again (it sits in the caches:
this CPU's L3 is large), and "cold" (``--cold-mb``, one shape), a pass over copies of the matrix
whose float32 bytes total that many MB, so most products read their weights from memory, as a
decode step of a real model does. Each figure: "best / median" ms over --repeats × --inner calls
(engines alternate inside each repeat), at 1 and 2 torch threads; the ratio to float32 is of
the best times (the machine is shared: the best is the least disturbed). Usage:
``python bench/format_gemv.py [--cold-mb 768] [--repeats 5] [--inner 3] [--formats float32,Q4_K]
[--shapes 4864x896] [--threads 1] [--rows 4]`` (the cold pass uses the first shape; --rows: rows
of x, 1 for decode, more for a few sequences or speculative tokens at once).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from clearlm.quant import QuantLinear, pack_blocks
from clearlm.quant.half import HalfLinear, banded_linear
from clearlm.quant.kernels import load_kernels
from clearlm.quant.tiles import tile_rows

SHAPES = [(4864, 896), (896, 4864), (1536, 576), (8192, 2048)]  # (N out, K in)


def k_blocks(qtype: Q, shape: tuple[int, int], seed: int) -> np.ndarray:
    """Random K-quant / IQ4_NL / IQ4_XS blocks of a (N, K) matrix, float16 scales in
    [2^-12, 2^-8)."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (shape[0] * shape[1] // block, size), dtype=np.uint8)
    at_d = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q3_K: (108,), Q.Q2_K: (80, 82)}
    for at in at_d.get(qtype, (0,)):  # d, dmin; d
        f = rng.uniform(2**-12, 2**-8, b.shape[0]).astype("<f2")
        b[:, at : at + 2] = f.view(np.uint8).reshape(-1, 2)
    return b


def engines(
    w: torch.Tensor, formats: set[str] | None = None, seed: int = 0
) -> dict[str, tuple[int, Callable[[torch.Tensor], torch.Tensor]]]:
    """name → (weight bytes, x (1, K) → (1, N)) for one float32 weight (N, K); only the
    formats named in ``formats`` (None: all), float32 always."""
    out: dict[str, tuple[int, Callable]] = {"float32": (w.nbytes, lambda x: F.linear(x, w))}
    if formats is not None:
        out.update({k: v for k, v in engines(w, None, seed).items() if k in formats})
        return out
    for name, dt in (("F16", torch.float16), ("BF16", torch.bfloat16)):
        w16 = w.to(dt)
        lin = HalfLinear(w16)
        out[name] = (w16.nbytes, lin)
        out[f"{name} torch widen"] = (w16.nbytes, lambda x, w16=w16: banded_linear(x, w16, None))
        out[f"{name} torch 16-bit*"] = (
            w16.nbytes,
            lambda x, w16=w16, dt=dt: F.linear(x.to(dt), w16).float(),
        )
    for qtype in (Q.Q8_0, Q.Q4_0):
        blocks = quantize(w.numpy(), qtype)
        p = tile_rows(pack_blocks(blocks, qtype, tuple(w.shape)))
        out[qtype.name] = (p.nbytes(), QuantLinear(p))
    for qtype in (Q.Q4_K, Q.Q6_K, Q.Q3_K, Q.Q2_K, Q.Q5_K, Q.IQ4_NL, Q.IQ4_XS):
        if w.shape[1] % GGML_QUANT_SIZES[qtype][0] == 0:  # rows of whole blocks
            shape = tuple(w.shape)
            p = tile_rows(pack_blocks(k_blocks(qtype, shape, seed), qtype, shape))
            out[qtype.name] = (p.nbytes(), QuantLinear(p))
    return out


def timed(fn: Callable, x: torch.Tensor, inner: int) -> list[float]:
    """ms of each of ``inner`` calls."""
    times = []
    for _ in range(inner):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


Timings = dict[int, tuple[float, float]]  # threads → (best, median) ms per product


def bench(shape: tuple[int, int], copies: int, args) -> dict[str, tuple[int, Timings]]:
    """name → (bytes, {threads: (best, median) ms per product}) over ``copies`` matrices."""
    g = torch.Generator().manual_seed(0)
    sets = [
        engines(torch.randn(*shape, generator=g) * 0.05, args.formats, i) for i in range(copies)
    ]
    x = torch.randn(args.rows, shape[1], generator=g)  # (M, K)
    out: dict[str, tuple[int, Timings]] = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        runs: dict[str, list[float]] = {name: [] for name in sets[0]}
        for _ in range(args.repeats):
            for name in sets[0]:

                def one_pass(x, name=name):  # each copy once: weights from memory if cold
                    for s in sets:
                        s[name][1](x)

                runs[name] += [t / copies for t in timed(one_pass, x, args.inner)]
        for name, ms in runs.items():
            best_median = (min(ms), statistics.median(ms))
            out.setdefault(name, (sets[0][name][0], {}))[1][threads] = best_median
    return out


def max_delta(shape: tuple[int, int], args) -> dict[str, float]:
    """Max |Δ| of each engine against float64 on the same (widened) weights."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(*shape, generator=g) * 0.05, torch.randn(args.rows, shape[1], generator=g)
    out = {}
    for name, (_, fn) in engines(w, args.formats).items():
        ref_w = {"F16": torch.float16, "BF16": torch.bfloat16}.get(name.split()[0])
        wr = w.to(ref_w).double() if ref_w is not None else w.double()
        if name.startswith(("Q", "IQ")):
            continue  # their values are the blocks' (tests/quant/test_quant.py)
        out[name] = (fn(x).double() - x.double() @ wr.T).abs().max().item()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold-mb", type=int, default=768, help="float32 MB of the cold pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--inner", type=int, default=3)
    ap.add_argument("--formats", help="comma-separated formats to time (default: all)")
    ap.add_argument("--shapes", help="comma-separated NxK shapes (default: the four below)")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--rows", type=int, default=1, help="rows of x (M)")
    args = ap.parse_args()
    args.formats = None if args.formats is None else set(args.formats.split(","))
    args.threads = [int(t) for t in args.threads.split(",")]
    shapes = (
        SHAPES
        if args.shapes is None
        else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    )
    print(f"kernel: {'built' if load_kernels() is not None else 'unavailable (torch fallback)'}")
    print(
        "| shape N×K | setting | format | weight MB | ms 1 thread | × float32 | ms 2 threads | "
        "× float32 | max abs Δ |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    cold = shapes[0]
    plan = [(s, "hot", 1) for s in shapes]
    plan.append((cold, "cold", max(1, args.cold_mb * 2**20 // (cold[0] * cold[1] * 4))))
    for shape, setting, copies in plan:
        res = bench(shape, copies, args)
        delta = max_delta(shape, args)
        base = res["float32"][1]
        for name, (nbytes, ms) in res.items():
            d = f"{delta[name]:.1e}" if name in delta else "-"
            cells = [
                f"{ms[t][0]:.3f} / {ms[t][1]:.3f} | {ms[t][0] / base[t][0]:.2f}"
                if t in ms
                else "- | -"
                for t in (1, 2)
            ]
            print(
                f"| {shape[0]}×{shape[1]} | {setting} ×{copies} | {name} | "
                f"{nbytes / 1e6:.2f} | {cells[0]} | {cells[1]} | {d} |"
            )
    print("* x rounded to 16 bits: not exact (for speed only)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
