"""Matrix-vector speed of compact block-quantized weights against float32 (clearlm.quant).

Part 1 (shapes): for each model's matrix shapes (N out, K in) and 8192 x 8192, the time of one
x (1, K) @ W.T for W held as Q8_0 / Q4_1 / Q4_K / Q5_0 / Q6_K (random blocks, repacked by
clearlm.quant.pack) through QuantLinear, in row tiles as a compact load holds them
(clearlm.quant.tiles) and row-major ("Q8_0 rows"), and for float32 F.linear; ms, GB/s of weight
bytes read, and the ratio to float32. With ``--candidates``, 8192 x 8192 also times torch's own
packed CPU kernels (``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``) and bfloat16.
Part 2 (models, ``--models``): every matrix a decode step reads in the real GGUFs (a tied
embedding counts once, as the head), packed as stored; time of one token's worth of GEMVs, the
bytes read and the decode ceiling it implies (matmuls only), compact (tiled as loaded, and
row-major) vs float32. With ``--int8``, both parts also time the layer as loaded with int8-
rounded activations (" int8": the opt-in mode, csrc/qgemv_i8.cpp; not exact).

How: torch threads = --threads (default 2); engines alternate inside each repeat; each timing is
the median of --inner calls, each figure the median over --repeats. The machine is shared:
compare ratios. Usage: ``python bench/quant_gemv.py [--models] [--candidates] [--int8]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGUFReader
from gguf import GGMLQuantizationType as Q

from clearlm.quant import QuantLinear, pack_blocks
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import set_int8_activations
from clearlm.quant.ops import int8_available
from clearlm.quant.pack import Packed
from clearlm.quant.tiles import can_tile, tile_rows
from clearlm.store.catalog import resolve_model

SHAPES = {  # model: (d_model, d_ff, vocab)
    "SmolLM2-135M": (576, 1536, 49152),
    "Qwen2.5-Coder-0.5B": (896, 4864, 151936),
    "Gemma3-270M": (640, 2048, 262144),
}
FORMATS = [Q.Q8_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q6_K]
CACHE = Path.home() / ".cache" / "clearlm"
REAL = {  # name: (path, llama.cpp tg128 tok/s measured in issue 10)
    "SmolLM2-135M Q4_1": (None, 143.0),
    "Qwen2.5-Coder-0.5B Q4_K_M": (CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 31.8),
    "Gemma3-270M Q4_K_M": (CACHE / "gemma-3-270m-q4_k_m.gguf", 59.6),
}


STAT = {"median": statistics.median, "min": min}
stat = statistics.median
clock = time.perf_counter


def timed(fn: Callable[[], object], inner: int) -> float:
    """Seconds of one call (median, or --stat min) over `inner` calls after one warm-up call."""
    fn()
    ts = []
    for _ in range(inner):
        t = clock()
        fn()
        ts.append(clock() - t)
    return stat(ts)


def alternate(fns: dict[str, Callable[[], object]], repeats: int, inner: int) -> dict[str, float]:
    """Median over `repeats` rounds, each round timing every engine once in turn."""
    got: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            got[k].append(timed(fn, inner))
    return {k: statistics.median(v) for k, v in got.items()}


def random_layer(qtype: Q, n: int, k: int, rng: np.random.Generator) -> Packed:
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n * k // block, size), dtype=np.uint8)
    off = {Q.Q6_K: [208], Q.Q4_K: [0, 2], Q.Q4_1: [0, 2]}.get(qtype, [0])
    for o in off:  # finite float16 scales
        d = (rng.random(raw.shape[0]) * 0.01).astype(np.float16)
        raw[:, o : o + 2] = d.view(np.uint8).reshape(-1, 2)
    return pack_blocks(raw, qtype, (n, k))


def layers(p: Packed, int8: bool = False) -> dict[str, QuantLinear]:
    """The weight as a compact load holds it (row tiles, quant/tiles.py, where N allows) and
    row-major (" rows"): the same bytes in the two layouts the kernel reads. With `int8`, also
    " int8": as loaded, with int8-rounded activations (csrc/qgemv_i8.cpp, opt-in, inexact)."""
    loaded = tile_rows(p) if can_tile(p) else p  # the layout a compact load holds
    out = {"": QuantLinear(loaded)} if can_tile(p) else {}
    out |= {" rows": QuantLinear(p)}
    if int8:
        out[" int8"] = QuantLinear(loaded)  # the same tensors, its own int8 switch
        set_int8_activations(out[" int8"])
    return out


def shape_table(args: argparse.Namespace) -> list[str]:
    rng = np.random.default_rng(0)
    shapes = [(m, n, k) for m, (d, f, v) in SHAPES.items() for n, k in
              [(d, d), (f, d), (d, f), (v, d)]] + [("square", 8192, 8192)]
    rows = ["| model | N x K | engine | ms | GB/s | vs f32 |", "|---|---|---|---:|---:|---:|"]
    for model, n, k in shapes:
        x = torch.randn(1, 1, k)  # (B, T, K)
        w = torch.randn(n, k)
        fns: dict[str, Callable[[], object]] = {"float32": lambda w=w, x=x: F.linear(x, w)}
        nbytes = {"float32": w.nbytes}
        for qt in FORMATS:
            if k % GGML_QUANT_SIZES[qt][0]:
                continue  # K-quants need rows that are whole 256-value super-blocks
            for suffix, layer in layers(random_layer(qt, n, k, rng), args.int8).items():
                fns[qt.name + suffix] = lambda layer=layer, x=x: layer(x)
                nbytes[qt.name + suffix] = layer.weight_nbytes()
        if args.candidates and n == 8192:
            fns |= candidates(x, n, k, nbytes)
        with torch.inference_mode():
            ms = alternate(fns, args.repeats, args.inner)
        for name, sec in ms.items():
            rows.append(f"| {model} | {n}x{k} | {name} | {sec * 1e3:.3f} | "
                        f"{nbytes[name] / sec / 1e9:.1f} | {ms['float32'] / sec:.2f}x |")
    return rows


def candidates(x: torch.Tensor, n: int, k: int, nbytes: dict[str, int]) -> dict:
    """torch's packed CPU kernels and bfloat16 on the same shape (random weights)."""
    x2 = x.reshape(1, k)
    wb, xb = torch.randn(n, k).bfloat16(), x2.bfloat16()
    w8, s8 = torch.randint(-128, 127, (n, k), dtype=torch.int8), torch.rand(n)
    codes4 = torch.randint(0, 16, (n, k), dtype=torch.int32)
    w4 = torch._convert_weight_to_int4pack_for_cpu(codes4, 1)
    sz = torch.rand(k // 32, n, 2)
    nbytes |= {"bfloat16": wb.nbytes, "torch int8pack": w8.nbytes + s8.nbytes,
               "torch int4pack": w4.nbytes + sz.nbytes}
    return {
        "bfloat16": lambda: F.linear(xb, wb),
        "torch int8pack": lambda: torch._weight_int8pack_mm(x2, w8, s8),
        "torch int4pack": lambda: torch._weight_int4pack_mm_for_cpu(x2, w4, 32, sz),
    }


def decode_matrices(path: Path, int8: bool = False
                    ) -> list[tuple[str, dict[str, QuantLinear], torch.Tensor]]:
    """(name, compact layers (tiled as loaded, row-major, with `int8` int8 activations too),
    float32 weight) of every matrix one decode step reads."""
    reader = GGUFReader(path)
    names = {t.name for t in reader.tensors}
    out = []
    for t in reader.tensors:
        if len(t.shape) != 2 or (t.name == "token_embd.weight" and "output.weight" in names):
            continue  # the embedding is a row lookup unless it doubles as the tied head
        both = layers(pack_blocks(t.data, t.tensor_type, (int(t.shape[1]), int(t.shape[0]))),
                      int8)
        out.append((t.name, both, both[" rows"].dequantized()))
    return out


def model_table(args: argparse.Namespace) -> list[str]:
    rows = ["| model | weights/token compact | float32 | ms/token compact | row-major | float32 | "
            "GB/s compact | ceiling tok/s compact | row-major | float32 | llama.cpp tg128 |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    if args.int8:
        rows[0] += " ms/token int8 |"
        rows[1] += "---:|"
    for name, (path, llama_tg) in REAL.items():
        path = path or resolve_model("smollm2-135m-instruct")
        if not Path(path).exists():
            continue
        mats = decode_matrices(Path(path), args.int8)
        xs = [torch.randn(1, 1, w.shape[1]) for _, _, w in mats]

        def run_q(mats=mats, xs=xs, layout: str = "") -> None:  # tiled where it can be
            for (_, lays, _), x in zip(mats, xs, strict=True):
                lays.get(layout, lays[" rows"])(x)

        def run_f(mats=mats, xs=xs) -> None:
            for (_, _, w), x in zip(mats, xs, strict=True):
                F.linear(x, w)

        with torch.inference_mode():
            engines = {"q": run_q, "r": lambda: run_q(layout=" rows"), "f": run_f}
            if args.int8:
                engines["i8"] = lambda: run_q(layout=" int8")
            s = alternate(engines, args.repeats, max(3, args.inner // 2))
        qb = sum(lays[" rows"].weight_nbytes() for _, lays, _ in mats)
        fb = sum(w.nbytes for _, _, w in mats)
        rows.append(f"| {name} | {qb / 2**20:.0f} MiB | {fb / 2**20:.0f} MiB | "
                    f"{s['q'] * 1e3:.2f} | {s['r'] * 1e3:.2f} | {s['f'] * 1e3:.2f} | "
                    f"{qb / s['q'] / 1e9:.1f} | {1 / s['q']:.0f} | {1 / s['r']:.0f} | "
                    f"{1 / s['f']:.0f} | {llama_tg} |"
                    + (f" {s['i8'] * 1e3:.2f} |" if args.int8 else ""))
        del mats
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inner", type=int, default=7)
    ap.add_argument("--candidates", action="store_true", help="torch packed kernels at 8192^2")
    ap.add_argument("--models", action="store_true", help="decode ceiling on the real GGUFs")
    ap.add_argument("--no-shapes", action="store_true", help="skip part 1")
    ap.add_argument("--int8", action="store_true",
                    help="also time int8-rounded activations (opt-in mode, csrc/qgemv_i8.cpp)")
    ap.add_argument("--stat", choices=list(STAT), default="median",
                    help="per-timing statistic: min shows the uncontended speed on a busy machine")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: this thread's CPU time (with --threads 1 only): the time the work "
                    "took while it ran, not counting waits for a shared machine's cores")
    args = ap.parse_args()
    if args.int8 and not int8_available():
        ap.error("--int8: the int8 kernel is not built here (needs AVX-512 VNNI or AVX2)")
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu needs --threads 1 (other threads' time would be missed)")
    global stat, clock
    stat = STAT[args.stat]
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    kind = "C++" if load_kernels() else "torch fallback"
    print(f"kernel: {kind}, threads {args.threads}, {args.clock} clock, {args.stat} of "
          f"{args.inner} calls, median over {args.repeats} alternating repeats")
    if not args.no_shapes:
        print("\n".join(shape_table(args)))
    if args.models:
        print("\n".join(model_table(args)))


if __name__ == "__main__":
    main()
