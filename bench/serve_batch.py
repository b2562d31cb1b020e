"""``clearlm serve`` decoding its batches through the compiled batched step against ``--eager``.

Starts ``clearlm serve MODEL --compile`` and ``clearlm serve MODEL --eager`` in turn (a process
each, 127.0.0.1, a free port, the same ``--threads``), ``--alternations`` times each, compiled
first; against each, ``--clients`` concurrent clients each send ``--per-client`` streaming
greedy ``/v1/completions`` one after another (``max_tokens`` tokens, ``ignore_eos`` so every
completion has that length), and prints per run and as medians: aggregate generated tokens/s
(over the wall time from the first request to the last token), requests/s, p50 / p95 time to
first token, and whether every completion's text equals the other mode's (greedy: the same
text is expected). ``--compile`` builds the package before serving if it is not built yet
(``clearlm compile --batch`` builds it ahead); that build is not timed.

Usage: ``.venv/bin/python bench/serve_batch.py [--model ALIAS] [--clients 8] [--per-client 4]
[--max-tokens 64] [--alternations 3] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from serve_load import PROMPTS, Outcome, cells, medians, summarize

ROOT = Path(__file__).resolve().parents[1]


async def one(client, prompt: str, max_tokens: int) -> Outcome:
    """Stream one greedy completion of exactly max_tokens tokens; never raises."""
    out = Outcome(prompt, 0)
    t0 = time.perf_counter()
    try:
        stream = await client.completions.create(
            model="m", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        parts = []
        async for chunk in stream:
            if chunk.usage is not None:
                out.completion_tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                if c.text and not parts:
                    out.ttft_s = time.perf_counter() - t0
                parts.append(c.text)
        out.text = "".join(parts)
    except Exception as e:  # counted as a failure
        out.error = f"{type(e).__name__}: {e}"
    out.total_s = time.perf_counter() - t0
    return out


async def clients(url: str, n_clients: int, per_client: int, max_tokens: int):
    """n_clients clients at once, each sending per_client requests one after another (client
    c's request r: PROMPTS[(c + r) % len]). Returns (outcomes in (client, request) order, wall
    seconds)."""
    import openai

    api = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=900)

    async def client(c: int) -> list[Outcome]:
        return [await one(api, PROMPTS[(c + r) % len(PROMPTS)], max_tokens)
                for r in range(per_client)]

    t0 = time.perf_counter()
    done = await asyncio.gather(*(client(c) for c in range(n_clients)))
    wall = time.perf_counter() - t0
    await api.close()
    return [o for per in done for o in per], wall


def start_server(model: str, mode: str, threads: int, max_batch: int) -> tuple:
    """``clearlm serve`` in a process of its own; returns (process, base URL) once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("CLEARLM_DECODE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "clearlm", "serve", model, "--port", str(port), "--name", "m",
         "--threads", str(threads), "--max-batch", str(max_batch), f"--{mode}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 1800  # --compile may build the package first
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"clearlm serve --{mode} exited: {proc.stderr.read()}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc, f"http://127.0.0.1:{port}/v1"
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"clearlm serve --{mode} did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    runs: dict[str, list[dict]] = {"compile": [], "eager": []}
    texts: dict[str, list[str]] = {}
    print(f"{args.model}: {args.clients} clients x {args.per_client} greedy completions of "
          f"{args.max_tokens} tokens, --threads {args.threads}, {args.alternations} alternations")
    print("| run | mode | tokens/s | requests/s | TTFT p50 (s) | TTFT p95 (s) | failures |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for i in range(args.alternations):
        for mode in ("compile", "eager"):
            proc, url = start_server(args.model, mode, args.threads, args.clients)
            try:
                outcomes, wall = asyncio.run(
                    clients(url, args.clients, args.per_client, args.max_tokens))
            finally:
                proc.terminate()
                proc.wait(60)
            s = summarize(outcomes, wall)
            runs[mode].append(s)
            texts.setdefault(mode, [o.text for o in outcomes])
            print(f"| {i + 1} | {mode} | {cells(s)} | {s['failures']} |", flush=True)
            for o in outcomes:
                if o.error:
                    print("failed:", o.error)
    med = medians(runs)
    print("\n| mode | tokens/s | requests/s | TTFT p50 (s) | TTFT p95 (s) |")
    print("|---|---:|---:|---:|---:|")
    for m, s in med.items():
        print(f"| {m} | {cells(s)} |")
    ratio = med["compile"]["tokens_per_s"] / med["eager"]["tokens_per_s"]
    same = sum(a == b for a, b in zip(texts["compile"], texts["eager"], strict=True))
    print(f"\ncompiled / eager aggregate tokens/s: {ratio:.2f}x (medians); "
          f"{same} of {len(texts['eager'])} completions the same text in both modes")


if __name__ == "__main__":
    main()
