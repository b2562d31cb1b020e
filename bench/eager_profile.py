"""Where one eager decode step's time goes: ops per step, Python against kernels, top ops.

The eager step is ``clearlm.generation.loop.decode_step`` (what ``--eager``, ``explain``, hooks
and devices without a compiled step run). For each model and thread count: load it as
``clearlm.load`` does by default (compact weights for a GGUF), prefill a 16-token prompt into
a cache sized as ``clearlm generate -n 128`` sizes it, then

- ``step``: median wall and CPU (process_time) milliseconds of --steps greedy steps (the argmax
  included), no profiler on;
- ``torch calls``: Python-level torch calls per step (functions and tensor methods seen by a
  TorchFunctionMode; each pays Python → C++ dispatch), and ``aten ops``: operators the
  profiler records per step, top-level (called from Python) / all (nested included);
- ``Python / C``: cProfile's split of the step's time between Python functions' own time and
  built-in calls (torch ops, the compact kernel); cProfile slows Python more than C, so the
  Python share is an upper bound;
- the top ops by self CPU time per step (torch.profiler; the compact kernel, called through
  pybind and so invisible to the profiler, is counted under ``clearlm::qmm`` by a
  record_function around it).

Usage: ``python bench/eager_profile.py [--models smollm2 qwen gemma] [--threads 1 2]
[--steps 30] [--top 15]``. The machine may be shared: CPU time is the steadier column.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile, record_function

import clearlm
from clearlm.generation.loop import decode_step, generation_cache, prefill
from clearlm.quant import linear

MODELS = {
    "smollm2": "smollm2-135m-instruct",
    "qwen": "qwen2.5-coder-0.5b-instruct",
    "gemma": "gemma3-270m",
}


class CountCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called from Python, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.calls[getattr(func, "__name__", str(func))] += 1
        return func(*args, **(kwargs or {}))


def step(model: torch.nn.Module, token: torch.Tensor, cache) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """One greedy decode step: token (1, 1) → next token (1, 1)."""
    return decode_step(model, token, cache).argmax(-1, keepdim=True)


PLAIN_QMM = linear.qmm_eager


def timed_qmm(*args):  # type: ignore[no-untyped-def]
    """The compact kernel's call, shown to the profiler (it is called through pybind)."""
    with record_function("clearlm::qmm"):
        return PLAIN_QMM(*args)


def run(name: str, threads: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(threads)
    model = clearlm.load(MODELS[name], threads=threads, decode="eager").transformer.eval()
    cache = generation_cache(model, 16, 128)
    with torch.inference_mode():
        token = prefill(model, torch.arange(100, 116).view(1, 16), cache).argmax(-1, keepdim=True)
    n = args.steps
    for _ in range(4):
        token = step(model, token, cache)
    walls, cpus = [], []
    for _ in range(n):
        w, c = time.perf_counter(), time.process_time()
        token = step(model, token, cache)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    wall, cpu = statistics.median(walls), statistics.median(cpus)

    with CountCalls() as counter:
        token = step(model, token, cache)
    calls = sum(counter.calls.values())

    prof = cProfile.Profile()
    k = max(n // 3, 5)
    prof.enable()
    for _ in range(k):
        token = step(model, token, cache)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    builtin = sum(v[2] for f, v in stats.items() if f[0] == "~")  # C functions' own time
    python = sum(v[2] for f, v in stats.items() if f[0] != "~")

    linear.qmm_eager = timed_qmm
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(k):
            with record_function("step"):
                token = step(model, token, cache)
    linear.qmm_eager = PLAIN_QMM
    events = [e for e in p.events() if e.name != "step"]
    top_level = sum(1 for e in events if e.cpu_parent is not None and e.cpu_parent.name == "step")
    per_op: dict[str, list[float]] = {}
    for e in p.key_averages():
        if e.key != "step":
            per_op[e.key] = [e.self_cpu_time_total / k / 1e3, e.count / k]
    total = sum(v[0] for v in per_op.values())

    print(f"\n## {MODELS[name]} eager, {threads} thread(s)\n")
    print(f"step {wall * 1e3:.2f} ms wall ({1 / wall:.1f} tok/s), {cpu * 1e3:.2f} ms CPU "
          f"({1 / cpu:.1f} tok/s); torch calls per step {calls}; aten ops per step "
          f"{top_level / k:.0f} top-level / {len(events) / k:.0f} all; cProfile: Python "
          f"{python / k * 1e3:.2f} ms, C calls {builtin / k * 1e3:.2f} ms per step\n")
    print("| op (self CPU, profiler on) | ms/step | calls/step | share |\n|---|---:|---:|---:|")
    for key, (ms, cnt) in sorted(per_op.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"| {key} | {ms:.3f} | {cnt:.0f} | {ms / total:.0%} |")
    print(f"| all ops | {total:.3f} | {len(events) / k:.0f} | |")
    if args.calls:
        named = counter.calls.most_common()
        print("\ntorch calls by name:", ", ".join(f"{f} {c}" for f, c in named))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2"], choices=list(MODELS))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--calls", action="store_true", help="list the torch calls by name")
    args = p.parse_args()
    for name in args.models:
        for threads in args.threads:
            run(name, threads, args)


if __name__ == "__main__":
    main()
