"""Batched generation throughput: tokens/s for B concurrent sequences through the engine.

What is measured, on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF), for B = 1, 4, 16:
B requests (different P-token prompts cut from tests/data/alice.txt, default P = 32), each
generating N tokens (default 32, greedy, end ids ignored), are added to one
:class:`clearlm.engine.scheduler.BatchEngine` with B slots, which is stepped until all finish.
- ``tok/s wall``: generated tokens (B · N) / wall-clock seconds of the whole run (prefill
  included);
- ``tok/s CPU``: the same over the process's CPU seconds (on a machine other jobs share, CPU
  time with one thread does not count the time spent waiting for a core);
- ``decode tok/s CPU``: B / the median CPU seconds of a step in which every sequence decodes
  (no prefill in it): the steady-state rate;
- ``× B=1``: decode tok/s CPU relative to B = 1.
Weights: ``float32`` (every weight dequantized at load, the reference mode) and ``compact``
(block-quantized matrices kept packed: clearlm.loading.compact.swap.quantize_model on the same
file).
Each configuration runs once after an untimed warm-up of the same engine shape.
Usage: ``.venv/bin/python bench/batch_throughput.py [--threads 1] [--batches 1,4,16]
[--weights float32,compact] [--prompt-tokens 32] [--new-tokens 32]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
ALICE = ROOT / "tests" / "data" / "alice.txt"


def load(weights: str, threads: int):
    """The default model with float32 or compact weights."""
    import clearlm

    return clearlm.load(None, threads=threads, weights=weights)


def prompts(model, n_prompts: int, length: int) -> list[list[int]]:
    """n_prompts different prompts of exactly `length` ids: consecutive windows of alice.txt."""
    ids = model.encode(ALICE.read_text())
    assert len(ids) >= length + n_prompts, "alice.txt is too short for these prompts"
    return [ids[i : i + length] for i in range(n_prompts)]


def run(model, batch: int, prompt_len: int, new_tokens: int) -> dict[str, float]:
    """One engine run of `batch` concurrent requests; rates in tokens per second."""
    from clearlm.engine import Request
    from clearlm.engine.scheduler import BatchEngine
    from clearlm.sampling.chain import SamplingParams

    engine = BatchEngine(
        model.transformer,
        eos_ids=(),
        max_batch=batch,
        max_seq_len=prompt_len + new_tokens,
        prefill_chunk=prompt_len * batch,  # every prompt in the first step
    )
    greedy = SamplingParams(temperature=0)
    for i, p in enumerate(prompts(model, batch, prompt_len)):
        engine.add(Request(str(i), p, greedy, new_tokens))
    steps, n_tokens = [], 0
    t0, c0 = time.perf_counter(), time.process_time()
    while engine.has_work():
        s0 = time.process_time()
        events = engine.step()
        steps.append((time.process_time() - s0, len(events)))
        n_tokens += len(events)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    full = [dt for dt, n in steps[1:] if n == batch]  # steps after the prefill, all decoding
    return {
        "wall_tps": n_tokens / wall,
        "cpu_tps": n_tokens / cpu,
        "decode_tps": batch / statistics.median(full) if full else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--weights", default="float32,compact")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"SmolLM2-135M-Instruct Q4_1, {args.threads} thread(s), prompts of "
        f"{args.prompt_tokens} tokens, {args.new_tokens} new tokens per sequence, greedy\n"
    )
    print("| weights | B | tok/s wall | tok/s CPU | decode tok/s CPU | × B=1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for weights in args.weights.split(","):
        model = load(weights, args.threads)
        with torch.inference_mode():
            run(model, max(batches), args.prompt_tokens, 4)  # warm-up: allocator, kernels
        base = None
        for b in batches:
            r = run(model, b, args.prompt_tokens, args.new_tokens)
            base = base or r["decode_tps"]
            print(
                f"| {weights} | {b} | {r['wall_tps']:.1f} | {r['cpu_tps']:.1f} | "
                f"{r['decode_tps']:.1f} | {r['decode_tps'] / base:.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
