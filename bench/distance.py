"""The compact-weight mode's distance from float32 on real GGUF files (issue 10, item 2).

For each model: the float32 model (the reference, checked against transformers) and the compact
one (clearlm.load(..., weights=...)) read the same tokens of tests/data/alice.txt in
windows; printed as the Markdown table of docs/speed.md's "Compact weights":
- prefill path: one forward pass per window for both models;
- decode path: the compact model fed 4 tokens at a time through a KV cache (QuantLinear's
  kernel path, as in decoding) against the float32 model's prefill logits;
- perplexity of the whole text under each model (clearlm.generation.perplexity.perplexity);
- greedy text on the parity tests' prompts (tests/model/test_model_parity.py): how many of them give
  the same continuation in both modes.

With ``--matmul-precision medium`` the compact model computes its prefill with bfloat16
products (clearlm.runtime.precision); the float32 reference stays exact ("highest"). The decode path
(4 rows: the kernel) is not touched by it. With ``--int8`` the compact model's decode-sized
products (the "decode" and "greedy steps" paths) round their inputs to int8 per block of 32
(clearlm.quant.linear.set_int8_activations); its prefill (more than 16 rows) stays exact.

    PYTHONPATH=src python bench/distance.py [--models smollm2-135m-instruct ...] [--threads 2]
                                            [--matmul-precision highest|medium] [--int8]
"""

from __future__ import annotations

import argparse
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

import clearlm
from clearlm.generation.perplexity import perplexity
from clearlm.inspect.distance import Accumulator, Distance, greedy, window_distances
from clearlm.quant.linear import set_int8_activations
from clearlm.runtime.precision import set_matmul_precision

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma3-270m"]
PROMPTS = [  # tests/model/test_model_parity.py's PROMPTS
    "The capital of France is",
    "人工智能是计算机科学的一个分支，它",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "I have 3 cats 🐱 and 12 dogs 🐶. Together that makes",
]
HEADER = (
    "| model | path | positions | max \\|Δlogit\\| | mean KL (nats) | max KL (nats) | top-1 agree "
    "| PPL float32 | PPL compact | same greedy text |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def row(name: str, path: str, d: Distance, ppl: tuple[float, float], greedy: str) -> str:
    return (
        f"| {name} | {path} | {d.n_positions:,} | {d.max_abs_logit:.2e} | {d.mean_kl:.2e} | "
        f"{d.max_kl:.2e} | {100 * d.top1_agreement:.2f}% | {ppl[0]:.4f} | {ppl[1]:.4f} | "
        f"{greedy} |"
    )


def measure(
    name: str, window: int, stride: int, n_new: int, threads: int, precision: str = "highest",
    int8: bool = False,
) -> list[str]:
    t0 = time.time()
    ref = clearlm.load(name, weights="float32", threads=threads)
    small = clearlm.load(name, weights="compact", threads=threads)
    set_matmul_precision(small.transformer, precision)
    if int8:
        set_int8_activations(small.transformer)
    ids = ref.encode((ROOT / "tests" / "data" / "alice.txt").read_text(encoding="utf-8"))
    a, b = ref.transformer, small.transformer
    d = window_distances(a, b, ids, window, stride, chunks=(None, 4))
    ppl = (perplexity(a, ids).perplexity, perplexity(b, ids).perplexity)
    same, steps = 0, Accumulator()  # the greedy steps' logits, where the texts agree
    for p in PROMPTS:
        (ta, la), (tb, lb) = greedy(a, ref.encode(p), n_new), greedy(b, ref.encode(p), n_new)
        same += ta == tb
        if ta == tb:
            steps.add(la, lb)
    greedy_txt = f"{same}/{len(PROMPTS)} ({n_new} tokens)"
    rows = [
        row(name, "prefill", d[None], ppl, greedy_txt),
        row(name, "decode (chunks of 4)", d[4], ppl, greedy_txt),
    ]
    if steps.n:  # the steps of the prompts whose greedy texts agree
        rows.append(row(name, "greedy steps (decode_step)", steps.result(), ppl, greedy_txt))
    print(f"[{name}: {time.time() - t0:.0f} s]", *rows, sep="\n", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--window", type=int, default=128, help="tokens per window")
    ap.add_argument("--stride", type=int, default=26, help="tokens between window starts")
    ap.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--matmul-precision",
        choices=["highest", "medium"],
        default="highest",
        help="the compact model's matmul precision (clearlm.runtime.precision)",
    )
    ap.add_argument("--int8", action="store_true",
                    help="the compact model's decode-sized products with int8 activations")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.models:
        rows += measure(
            name, args.window, args.stride, args.new_tokens, args.threads, args.matmul_precision,
            args.int8,
        )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(
        f"\nclearlm {commit}, {datetime.now(UTC):%Y-%m-%d}, {args.threads} threads, "
        f"tests/data/alice.txt in windows of {args.window} tokens every {args.stride}, "
        f"compact model's matmul precision {args.matmul_precision}"
        f"{', int8 activations' if args.int8 else ''}\n"
    )
    print(HEADER)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
