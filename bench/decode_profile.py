"""Where one decode step's time goes, per op kind, for compact (quantized) models.

For each model: load the GGUF with compact weights (clearlm.load(..., weights=...)),
prefill a 16-token prompt, then time decode steps. Two measurements:
- ``step``: wall and CPU time of one decode step (median of --steps steps, no timers); with
  --compile the eager and the compiled step alternate, step by step, on the same cache;
- a per-op table over --steps more steps: CPU time (process_time) of each op kind, timed by
  wrappers around leaf calls only (the kernel call per weight shape, SDPA, RoPE, norms, mask,
  cache write, embedding, argmax); the rest of the step is the eager Python between them
  (module calls, hooks, views, residual adds, activations). The wrappers add a few µs per call.

Usage: ``python bench/decode_profile.py [--threads 2] [--steps 30] [--models smollm2 qwen gemma]
[--compile] [--cache-len N]``. The compiled step reads and writes the whole cache
(--cache-len positions). The machine may be shared: quote the CPU-time column and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

import clearlm
from clearlm.generation.loop import decode_step, prefill
from clearlm.model import attention, norms, positions, transformer
from clearlm.model.kv_cache import CacheRows, KVCache
from clearlm.quant import ops
from clearlm.quant.embedding import QuantEmbedding
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import QuantLinear, set_int8_activations
from clearlm.store.catalog import resolve_model

CACHE = Path.home() / ".cache" / "clearlm"
MODELS = {
    "smollm2": lambda: resolve_model("smollm2-135m-instruct"),
    "qwen": lambda: CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma": lambda: CACHE / "gemma-3-270m-q4_k_m.gguf",
}


TIMES: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # label: [CPU seconds, calls]


def timer(name, fn):
    """fn with its CPU time (process_time: robust to a busy machine) added to TIMES[name]."""

    def wrapped(*a, **k):
        t = time.process_time()
        out = fn(*a, **k)
        rec = TIMES[name(*a) if callable(name) else name]
        rec[0] += time.process_time() - t
        rec[1] += 1
        return out

    return wrapped


def instrument(model: torch.nn.Module) -> None:
    """Time the op kinds (leaves only, so the rows add up; monkeypatch, this process only)."""
    kern = load_kernels()
    if kern is not None:  # the kernel call alone, per weight shape
        shapes = {(m.out_features, m.in_features): m.qtype for m in model.modules()
                  if isinstance(m, QuantLinear)}

        class Timed:
            def __getattr__(self, attr):
                return getattr(kern, attr)

            def qmm(self, x, codes, *rest):
                return self.timed(kern.qmm, x, codes, *rest)

            def qmm_i8(self, x, codes, *rest):
                return self.timed(kern.qmm_i8, x, codes, *rest)

            def timed(self, fn, x, codes, *rest):
                n, k = codes.shape[0], x.shape[1]
                return timer(f"qmm {n}x{k} {shapes.get((n, k), '')}", fn)(x, codes, *rest)

        timed = Timed()
        ops.load_kernels = lambda: timed
    attention.Attention.attend = timer("attention (SDPA)", attention.Attention.attend)
    transformer.Transformer.masks = timer("masks (once per step)", transformer.Transformer.masks)
    attention.apply_rope = timer("rope", attention.apply_rope)
    norms.RMSNorm.forward = timer("norm", norms.RMSNorm.forward)
    positions.RotaryEmbedding.forward = timer("rope tables", positions.RotaryEmbedding.forward)
    QuantEmbedding.forward = timer("embedding lookup", QuantEmbedding.forward)
    CacheRows.update_and_fetch = timer("kv cache write", CacheRows.update_and_fetch)


def build(path: Path):
    """The compact model as ``clearlm.load(weights="compact")`` builds it (packed straight from
    the file, Q/K/V and gate/up fused: clearlm.quant.fuse)."""
    model = clearlm.load(str(path), weights="compact", threads=torch.get_num_threads())
    return model.transformer.eval()


def run(name: str, args: argparse.Namespace) -> None:
    model = build(MODELS[name]())
    if args.int8:
        set_int8_activations(model)
    step = decode_step
    if args.compile:
        from clearlm.runtime.compiled import CompiledDecodeStep

        step = CompiledDecodeStep(model, mode=args.mode, cpp_wrapper=args.cpp_wrapper)
    n = args.cache_len or 16 + 6 * args.steps + 8
    c = model.config
    cache = KVCache(c.n_layers, 1, c.n_kv_heads, c.head_dim, n)  # float32 keys/values
    tok = torch.arange(100, 116).view(1, 16)
    logits = prefill(model, tok, cache)
    nxt = logits.argmax(-1, keepdim=True)  # (1, 1)
    t = time.perf_counter()
    for _ in range(4):
        nxt = step(model, nxt, cache).argmax(-1, keepdim=True)
    if args.compile:
        print(f"first call {step.compile_s:.1f} s ({step.compile_cpu_s:.1f} s CPU), 4 warm-up "
              f"steps {time.perf_counter() - t:.1f} s")
    steps = {"eager": decode_step, "compiled": step} if args.compile else {"eager": step}
    walls: dict[str, list[float]] = {k: [] for k in steps}
    cpus: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.steps):  # engines alternate step by step (same cache, same positions)
        for k, fn in steps.items():
            w, c = time.perf_counter(), time.process_time()
            nxt = fn(model, nxt, cache).argmax(-1, keepdim=True)
            walls[k].append(time.perf_counter() - w)
            cpus[k].append(time.process_time() - c)
    for k in steps:
        wall, cpu = statistics.median(walls[k]), statistics.median(cpus[k])
        print(f"\n## {name} {k} ({args.threads} threads): step {wall * 1e3:.2f} ms wall "
              f"({1 / wall:.1f} tok/s), {cpu * 1e3:.2f} ms CPU ({1 / cpu:.1f} tok/s)")
    if args.compile:
        return
    instrument(model)
    TIMES.clear()
    c0 = time.process_time()
    for _ in range(args.steps):
        with torch.inference_mode():
            logits = step(model, nxt, cache)
        t = time.process_time()
        nxt = logits.argmax(-1, keepdim=True)
        rec = TIMES["sampling (argmax)"]
        rec[0] += time.process_time() - t
        rec[1] += 1
    total = (time.process_time() - c0) / args.steps
    rows = {k: (v[0] / args.steps * 1e3, v[1] / args.steps) for k, v in TIMES.items()}
    rows["rest: Python glue, hooks, views, adds, activations"] = (
        total * 1e3 - sum(v[0] for v in rows.values()), 0)
    print("| op (CPU time, timers on) | ms/step | calls/step | share |\n|---|---:|---:|---:|")
    for k, (ms, cnt) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
        print(f"| {k} | {ms:.3f} | {cnt:.0f} | {ms / total / 1e3:.0%} |")
    print(f"| total (timers on) | {total * 1e3:.3f} | | |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--compile", action="store_true",
                   help="time clearlm.runtime.compiled's step instead")
    p.add_argument("--mode", default="default", help="torch.compile mode with --compile")
    p.add_argument("--cpp-wrapper", action="store_true", help="Inductor's C++ wrapper")
    p.add_argument("--cache-len", type=int, default=0,
                   help="KV cache positions (default: just what the run needs)")
    p.add_argument("--int8", action="store_true", help="int8-rounded activations (opt-in)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.models:
        run(name, args)
        if not args.compile:
            return  # the timers stay patched in: one model per process


if __name__ == "__main__":
    main()
