"""Peak memory per rank: one process against 2 ranks, tensor and pipeline parallel (issue 12).

For each model (SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-0.5B-Instruct Q4_K_M; float32) and
each layout (1 process; --tensor-parallel 2; --pipeline-parallel 2), the ranks are started on
this host as torchrun would (gloo, 127.0.0.1); each loads its share, runs a 16-token prompt and
16 greedy cached steps, and reports:
- peak RSS (MiB): ``ru_maxrss`` of the rank's process (includes the pages of the memory-mapped
  GGUF file it touched, and the transient of dequantizing);
- weights (MiB): bytes of the parameters the rank holds (a tied head counts once);
- after imports / after header (MiB): the process's peak RSS once torch and clearlm are
  imported, and once the file's header and tokenizer are read (before any weight).
All in MiB. Expectation: peak ≈ after header + weights/N + a transient.

Usage: python bench/parallel_memory.py [--models smollm2-135m-instruct PATH ...] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QWEN = str(Path.home() / ".cache/clearlm/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
LAYOUTS = [("1 process", {}, 1), ("tensor ×2", {"tensor_parallel": 2}, 2)]
LAYOUTS += [("pipeline ×2", {"pipeline_parallel": 2}, 2)]


def rank_main(model: str, sizes: dict) -> None:
    """One rank: load, generate, print a JSON line with its numbers (all ranks print)."""
    import torch

    import clearlm
    from clearlm.generation.loop import decode_step, new_cache, prefill
    from clearlm.runtime.parallel import launch

    def peak_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    base, header = peak_mib(), []
    check = lambda _m: header.append(peak_mib())  # noqa: E731 — after config + tokenizer
    m = clearlm.load(model, dtype="float32", threads=1, check=check, **sizes)
    t = m.transformer
    held = {p.data_ptr(): p.numel() * p.element_size() for p in t.parameters() if not p.is_meta}
    ids = torch.tensor([m.encode("def quicksort(items):\n    " * 3)[:16]])  # (1, 16)
    cache = new_cache(t, 1, 33)
    tok = prefill(t, ids, cache).argmax(-1, keepdim=True)
    for _ in range(16):
        tok = decode_step(t, tok, cache).argmax(-1, keepdim=True)
    row = dict(rank=launch.rank(), base=base, header=header[0], peak=peak_mib())
    row["weights"] = sum(held.values()) / 2**20
    print(json.dumps(row), flush=True)
    launch.shutdown()


def run_layout(model: str, sizes: dict, n: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--rank-of", model, json.dumps(sizes)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    procs = []
    for r in range(n):
        dist_env = dict(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n))
        dist_env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        rank_env = {**env, **(dist_env if n > 1 else {})}
        procs.append(subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE))
    rows = []
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed ({p.returncode}) for {model} {sizes}")
        rows.append(json.loads(out.decode().strip().splitlines()[-1]))
    return sorted(rows, key=lambda r: r["rank"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", QWEN])
    ap.add_argument("--rank-of", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        rank_main(args.rank_of[0], json.loads(args.rank_of[1]))
        return
    print("| model | layout | rank | weights held | after imports | after header | peak RSS |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model in args.models:
        name = Path(model).name.removesuffix(".gguf")
        for label, sizes, n in LAYOUTS:
            for row in run_layout(model, sizes, n):
                print(
                    f"| {name} | {label} | {row['rank']} | {row['weights']:.0f} | "
                    f"{row['base']:.0f} | {row['header']:.0f} | {row['peak']:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
