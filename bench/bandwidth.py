"""Decode as a fraction of the memory-bandwidth ceiling: clearlm's default path and llama.cpp.

    python bench/bandwidth.py [--models A B ...] [--threads 2] [--repeats 3] [--llama-reps 3]

A decode step reads every weight matrix once, so tokens/s can be at most
``read bandwidth / weight bytes read per token`` (the "ceiling"). This script measures:

- the read bandwidth: GB/s of one float32 matrix-vector product over a 1 GiB matrix
  (``torch.mv``, the given threads, best of 7), before and after the runs;
- the weight bytes one token reads, per engine: clearlm's from the loaded model (every matrix
  once as held, packed or 16-bit or float32, a tied embedding once as the output projection, one
  embedding row: bench/generate.py's ``weight_bytes``); llama.cpp's from the file, counted
  the same way (every tensor's bytes, an untied ``token_embd`` only its one row);
- tg128 of both, alternating, medians of ``--repeats``: clearlm's default decode path
  (bench/clearlm_run.py ``--decode default``, its compiled step built first, untimed) and
  ``llama-bench -n 128`` (bench/build_llamacpp.sh builds it).

It prints each engine's achieved GB/s (bytes per token × tokens/s) and that as a percentage of
the measured bandwidth. A model whose weights fit in the L3 cache (260 MiB on this machine)
is partly read from cache, so it can pass 100 %.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from generate import weight_bytes  # noqa: E402
from llamacpp import Mode, build_llama_bench, clearlm_run, compile_default, llama_bench  # noqa: E402
from quantize_models import resolve as resolve_models  # noqa: E402

MODELS = ["smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct"]


def read_bandwidth(threads: int, mib: int = 1024, reps: int = 7) -> float:
    """GB/s (1e9 bytes) of ``torch.mv`` over a float32 (n, n) matrix of about ``mib`` MiB with
    ``threads`` threads, best of ``reps`` (the matrix is far larger than any cache)."""
    torch.set_num_threads(threads)
    n = int((mib * 2**20 / 4) ** 0.5)
    w, x = torch.randn(n, n), torch.randn(n)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mv(w, x)
        best = min(best, time.perf_counter() - t)
    return w.numel() * 4 / best / 1e9


def clearlm_bytes(path: Path) -> int:
    """Bytes one decode step of clearlm's default load of ``path`` reads (weight_bytes)."""
    import clearlm

    m = clearlm.load(path)
    net = m.transformer
    return weight_bytes(net, net.embed_tokens, net.lm_head, m.config.vocab_size)


def file_bytes(path: Path) -> int:
    """Bytes one llama.cpp decode step reads, counted as ``weight_bytes`` counts clearlm's:
    every tensor of the file once, an untied token embedding (one with an ``output.weight``
    beside it) not multiplied, plus the one embedding row looked up."""
    from clearlm.loading.gguf_file import GGUFFile

    tensors = {t.name: t for t in GGUFFile(path).tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    embed = tensors["token_embd.weight"]
    if "output.weight" in tensors:
        total -= int(embed.n_bytes)
    return total + int(embed.n_bytes) // int(embed.shape[1])  # GGUF shape: (d_model, vocab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llama-reps", type=int, default=3)
    a = ap.parse_args()
    if min(a.threads, a.repeats, a.llama_reps) < 1:
        ap.error("--threads, --repeats and --llama-reps must be at least 1")
    paths = resolve_models(a.models)
    binary = build_llama_bench()
    mode = Mode()
    for p in paths:
        compile_default(p, mode, a.threads)
    bw = [read_bandwidth(a.threads)]
    rows = []
    for p in paths:
        ours, theirs = [], []
        for _ in range(a.repeats):  # alternating, as bench/llamacpp.py
            ours.append(clearlm_run(p, mode, a.threads).tg128)
            theirs.append(llama_bench(binary, p, a.threads, a.llama_reps).tg128)
        rows.append((p, clearlm_bytes(p), file_bytes(p), statistics.median(ours),
                     statistics.median(theirs)))  # fmt: skip
    bw.append(read_bandwidth(a.threads))
    gbs = statistics.mean(bw)
    print(
        f"read bandwidth: {bw[0]:.1f} GB/s before, {bw[1]:.1f} after (torch.mv over 1 GiB, "
        f"{a.threads} threads); the percentages use their mean, {gbs:.1f} GB/s\n"
    )
    print(
        "| model | engine | weight MB read per token | tg128 tok/s | GB/s read | "
        "% of bandwidth | ceiling tok/s |\n|---|---|---:|---:|---:|---:|---:|"
    )
    for p, ob, fb, ot, lt in rows:
        for engine, nbytes, tps in (("clearlm (default)", ob, ot), ("llama.cpp", fb, lt)):
            got = nbytes * tps / 1e9
            print(
                f"| {p.name} | {engine} | {nbytes / 1e6:.1f} | {tps:.1f} | {got:.1f} | "
                f"{100 * got / gbs:.0f} % | {gbs * 1e9 / nbytes:.1f} |"
            )


if __name__ == "__main__":
    main()
