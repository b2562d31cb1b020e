"""Two ahead-of-time compiled decode steps (clearlm.runtime.aot packages) against each other, in one
process, steps alternating: for changes worth a few percent on a machine whose speed drifts
by more than that between runs.

    python bench/aot_ab.py MODEL --path          # build or load this tree's package; print it
    python bench/aot_ab.py MODEL PKG_A PKG_B [--threads 2] [--rounds 6]

A package from another commit: ``git worktree add /tmp/base COMMIT``, then
``PYTHONPATH=/tmp/base/src python bench/aot_ab.py MODEL --path`` prints its path (the package
name is a digest of the source, so the two trees' packages sit side by side in the cache).

How: the model is loaded once (compact weights); both packages read its tensors. Each round
runs 128 decode steps from an empty 128-position cache on each of two caches, the two steps
of a position back to back, which one first alternating; each step is timed alone. Printed:
each package's median, 10th percentile and mean ms per step, and the median of the per-step
ratios B / A (below 1: B is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import clearlm
from clearlm.inspect.distance import cache_for
from clearlm.runtime.aot import AOTDecodeStep

STEPS = 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a GGUF path or alias")
    ap.add_argument("packages", nargs="*", help="PKG_A PKG_B (.pt2 files)")
    ap.add_argument("--path", action="store_true", help="print this tree's package path")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    if not a.path and len(a.packages) != 2:
        sys.exit("error: give two packages (PKG_A PKG_B), or --path")
    net = clearlm.load(a.model, weights="compact", threads=a.threads).transformer
    ids = torch.randint(0, net.config.vocab_size, (1, STEPS),
                        generator=torch.Generator().manual_seed(0))  # (1, STEPS)
    if a.path:
        step = AOTDecodeStep(net)
        step(net, ids[:, :1], cache_for(net, STEPS))  # builds the package if it is not there
        print(step.path)
        return
    steps = []
    for p in a.packages:
        step = AOTDecodeStep(net)
        step.package_path = lambda p=Path(p): p  # this package, whatever this tree's key
        step(net, ids[:, :1], cache_for(net, STEPS))  # load it (untimed)
        steps.append(step)
    times: list[list[float]] = [[], []]
    for _ in range(a.rounds):
        caches = [cache_for(net, STEPS), cache_for(net, STEPS)]
        for i in range(STEPS):
            for j in (0, 1) if i % 2 == 0 else (1, 0):
                t = time.perf_counter()
                steps[j](net, ids[:, i : i + 1], caches[j])  # (1, 1) token → (1, V) logits
                times[j].append(time.perf_counter() - t)
    for name, x in zip("AB", times, strict=True):
        x = sorted(x)
        print(f"{name}: median {statistics.median(x) * 1e3:.2f} ms  "
              f"p10 {x[len(x) // 10] * 1e3:.2f}  mean {statistics.mean(x) * 1e3:.2f}  "
              f"({len(x)} steps)")
    ratios = [b / a for a, b in zip(*times, strict=True)]
    print(f"B / A per step: median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
