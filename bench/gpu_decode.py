"""Decode speed on a GPU against its memory-bandwidth ceiling (issue 12).

A decode step reads every weight once, so tokens/s ≤ bandwidth / weight bytes read per token
(every matrix once; a tied embedding counts once, as lm_head). The script loads the model on
``--device`` (default cuda) in ``--dtype`` (default bfloat16), runs a warm-up, then N greedy
cached steps through clearlm's own prefill / decode_step loop, synchronising the device
around the timed part, and prints one table row. The bandwidth comes from ``--bandwidth-gbs``
or, for a known GPU name, the table below (vendor figures, GB/s).

Usage: python bench/gpu_decode.py [MODEL] [--steps 128] [--dtype bfloat16] [--bandwidth-gbs X]
"""

from __future__ import annotations

import argparse
import time

import torch

import clearlm
from clearlm.generation.loop import decode_step, new_cache, prefill

BANDWIDTH_GBS = {  # vendor peak memory bandwidth (GB/s)
    "H200": 4800,
    "H100 SXM": 3350,
    "H100 PCIe": 2000,
    "H100": 3350,
    "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935,
    "A100": 1555,
    "L40S": 864,
    "A10G": 600,
    "L4": 300,
    "T4": 320,
    "RTX 4090": 1008,
    "RTX 3090": 936,
}


def bandwidth_for(name: str) -> float | None:
    for key, gbs in BANDWIDTH_GBS.items():
        if key.lower() in name.lower():
            return float(gbs)
    return None


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every distinct parameter (a tied head counts once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--bandwidth-gbs", type=float, default=None)
    args = ap.parse_args()
    m = clearlm.load(args.model, dtype=args.dtype, device=args.device)
    t = m.transformer
    ids = torch.tensor([m.encode("def quicksort(items):\n")])  # (1, P)
    sync = torch.cuda.synchronize if t.device.type == "cuda" else (lambda: None)

    def run(steps: int) -> float:
        cache = new_cache(t, 1, ids.shape[1] + steps + 1)
        tok = prefill(t, ids, cache).argmax(-1, keepdim=True)  # (1, 1)
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            tok = decode_step(t, tok, cache).argmax(-1, keepdim=True)
        sync()
        return steps / (time.perf_counter() - start)

    run(8)  # warm-up: kernels, allocator
    tps = run(args.steps)
    name = torch.cuda.get_device_name(t.device) if t.device.type == "cuda" else "cpu"
    gbs = args.bandwidth_gbs or bandwidth_for(name)
    nbytes = weight_bytes(t)
    ceiling = gbs * 1e9 / nbytes if gbs else float("nan")
    print("| model | device | dtype | weights (MB) | decode tok/s | ceiling tok/s | of ceiling |")
    print("|---|---|---|---:|---:|---:|---:|")
    print(
        f"| {args.model} | {name} | {args.dtype} | {nbytes / 1e6:.0f} | {tps:.1f} | "
        f"{ceiling:.0f} | {tps / ceiling:.1%} |"
    )


if __name__ == "__main__":
    try:
        main()
    except clearlm.ClearLMError as e:
        raise SystemExit(f"error: {e}") from None
