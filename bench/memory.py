"""Load time and peak memory of clearlm, weights="compact" against "float32", on the GGUF models.

Each run is a fresh subprocess (this script with ``--child MODEL WEIGHTS``) that imports clearlm,
loads the model with ``threads`` torch threads and generates one greedy token after a short
prompt, then reports:
- load s: CPU time (``time.process_time``, all threads) and wall time from before
  ``import clearlm`` to the first generated token (the issue's "load" target: ≤ 3 s for
  Qwen2.5-Coder-0.5B). CPU time is the steadier figure on a shared machine;
- peak RSS: ``VmHWM`` of /proc/self/status (``ru_maxrss`` agrees), MiB, and the target
  285 MiB (python + torch) + 1.2 × llama.cpp's peak RSS (the issue's measurements);
- weights: what the loaded model holds (``Model.weight_bytes``) over the file's tensor bytes.
A baseline subprocess runs ``import torch`` alone. Runs alternate compact / float32 per model;
the table gives medians over ``--repeats``. Usage:
``PYTHONPATH=src .venv/bin/python bench/memory.py [--repeats 3] [--threads 2] [--models ...]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

PROMPT = "def fibonacci(n):"
LLAMA_CPP_RSS = {  # MiB, llama-bench peak RSS measured in the issue (2 threads)
    "smollm2-135m-instruct": 147,
    "qwen2.5-coder-0.5b-instruct": 593,
    "gemma3-270m": 331,
}
TORCH_BASELINE = 285  # MiB, the issue's `python -c "import torch"`


def hwm_mib() -> float:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmHWM"].split()[0]) / 1024


def child(model: str, weights: str, threads: int) -> dict:
    """One measured run in this (fresh) process."""
    c0, w0 = time.process_time(), time.perf_counter()
    import resource

    import clearlm
    from clearlm.loading.checkpoint import open_checkpoint
    from clearlm.store.catalog import resolve_model

    if model == "torch":
        return {"rss_mib": hwm_mib()}
    m = clearlm.load(model, threads=threads, weights=weights)
    c1, w1 = time.process_time(), time.perf_counter()
    m.generate(PROMPT, max_new_tokens=1, temperature=0)
    c2, w2 = time.process_time(), time.perf_counter()
    peak, maxrss = hwm_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    file_bytes = sum(t.n_bytes for t in open_checkpoint(resolve_model(model)).reader.tensors)
    return {
        "load_cpu_s": c1 - c0, "load_wall_s": w1 - w0,
        "first_cpu_s": c2 - c0, "first_wall_s": w2 - w0,
        "rss_mib": peak, "maxrss_mib": maxrss,
        "weight_mib": m.weight_bytes / 2**20, "file_mib": file_bytes / 2**20, "mode": m.weights,
    }  # fmt: skip


def run(model: str, weights: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", model, weights, "--threads", str(threads)]
    env = {"OMP_NUM_THREADS": str(threads)}
    import os

    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="*", default=list(LLAMA_CPP_RSS))
    ap.add_argument("--child", nargs=2)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.threads)))
        return
    base = statistics.median(run("torch", "-", 1)["rss_mib"] for _ in range(args.repeats))
    print(f"python + import torch alone: peak RSS {base:.0f} MiB ({args.threads} threads)\n")
    print(
        "| model | weights | load→1st token CPU s | wall s | peak RSS MiB | target MiB "
        "| weights MiB | / file tensors |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model in args.models:
        runs: dict[str, list[dict]] = {"compact": [], "float32": []}
        for _ in range(args.repeats):
            for weights in runs:
                runs[weights].append(run(model, weights, args.threads))
        target = TORCH_BASELINE + 1.2 * LLAMA_CPP_RSS[model]
        for rs in runs.values():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "mode"}
            print(
                f"| {model} | {rs[0]['mode']} | {med['first_cpu_s']:.2f} | "
                f"{med['first_wall_s']:.2f} | {med['rss_mib']:,.0f} | {target:,.0f} | "
                f"{med['weight_mib']:,.1f} | {med['weight_mib'] / med['file_mib']:.2f}× |"
            )


if __name__ == "__main__":
    main()
