"""Load on ``clearlm serve``: many concurrent streaming requests through the official client.

Starts the server in this process (uvicorn in a thread, 127.0.0.1, a free port) on the chosen
model, then runs ``--rounds`` rounds of ``--concurrency`` streaming ``/v1/completions`` requests
at once (``openai.AsyncOpenAI``), each with its own prompt and seed, and prints:
requests/s and generated tokens/s (over the wall time of all rounds), p50 / p95 time to first
token (from sending the request to the first streamed text), and the number of failures.
Usage: ``.venv/bin/python bench/serve_load.py [--model ALIAS] [--concurrency 32] [--rounds 3]
[--max-tokens 32] [--threads N]``. The tests (tests/serve/test_serve_load.py) run the same
functions.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import threading
import time
from dataclasses import dataclass

PROMPTS = [
    "Once upon a time", "The capital of France is", "def fibonacci(n):", "Dear Sir,",
    "In 1905, Einstein", "The recipe calls for", "My favourite colour is", "Q: Why?",
]  # fmt: skip


@dataclass
class Outcome:
    """One streamed request: its text, token count, finish reason and times (seconds)."""

    prompt: str
    seed: int
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    ttft_s: float = 0.0
    total_s: float = 0.0
    error: str | None = None


async def one(client, model: str, prompt: str, seed: int, max_tokens: int, temperature: float):
    """Stream one completion; never raises (a failure is recorded in ``error``)."""
    out = Outcome(prompt, seed)
    t0 = time.perf_counter()
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, seed=seed,
            temperature=temperature, stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        parts = []
        async for chunk in stream:
            if chunk.usage is not None:
                out.completion_tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                if c.text and not parts:
                    out.ttft_s = time.perf_counter() - t0
                parts.append(c.text)
                out.finish_reason = c.finish_reason or out.finish_reason
        out.text = "".join(parts)
    except Exception as e:  # counted as a failure, reported by the caller
        out.error = f"{type(e).__name__}: {e}"
    out.total_s = time.perf_counter() - t0
    return out


async def run_load(base_url: str, model: str, concurrency: int, rounds: int, max_tokens: int,
                   temperature: float = 0.8, api_key: str = "none"):  # fmt: skip
    """``rounds`` rounds of ``concurrency`` simultaneous requests (request i of round r: prompt
    PROMPTS[i % len], seed 1000 r + i). Returns (outcomes, wall seconds)."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
    outcomes = []
    t0 = time.perf_counter()
    for r in range(rounds):
        jobs = [one(client, model, PROMPTS[i % len(PROMPTS)], 1000 * r + i, max_tokens,
                    temperature) for i in range(concurrency)]  # fmt: skip
        outcomes += await asyncio.gather(*jobs)
    wall = time.perf_counter() - t0
    await client.close()
    return outcomes, wall


def summarize(outcomes: list[Outcome], wall: float) -> dict[str, float]:
    ok = [o for o in outcomes if o.error is None]
    ttfts = sorted(o.ttft_s for o in ok) or [0.0]
    return {
        "requests": len(outcomes),
        "failures": len(outcomes) - len(ok),
        "requests_per_s": len(ok) / wall,
        "tokens_per_s": sum(o.completion_tokens for o in ok) / wall,
        "ttft_p50_s": statistics.median(ttfts),
        "ttft_p95_s": ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
    }


def medians(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each name's runs (``summarize`` dicts) → one dict of each key's median over them."""
    return {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}


def cells(s: dict[str, float]) -> str:
    """A ``summarize`` dict as Markdown cells: tokens/s | requests/s | TTFT p50 | TTFT p95 (s)."""
    return (f"{s['tokens_per_s']:.1f} | {s['requests_per_s']:.2f} | {s['ttft_p50_s']:.2f} | "
            f"{s['ttft_p95_s']:.2f}")


def serve_in_thread(app) -> tuple[str, object, threading.Thread]:
    """Start uvicorn on 127.0.0.1:free port; return (base URL, server, thread)."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}/v1", server, thread


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    import clearlm
    from clearlm.serve import create_app

    model = clearlm.load(args.model, threads=args.threads)
    url, server, thread = serve_in_thread(create_app(model, model_id="m"))
    outcomes, wall = asyncio.run(run_load(url, "m", args.concurrency, args.rounds, args.max_tokens))
    server.should_exit = True
    thread.join()
    s = summarize(outcomes, wall)
    print(f"{args.model}: {args.concurrency} concurrent streaming requests x {args.rounds} rounds, "
          f"max_tokens {args.max_tokens}, {time.process_time():.1f} s CPU")  # fmt: skip
    print("| requests | failures | requests/s | tokens/s | TTFT p50 (s) | TTFT p95 (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {s['requests']} | {s['failures']} | {s['requests_per_s']:.2f} | "
          f"{s['tokens_per_s']:.1f} | {s['ttft_p50_s']:.2f} | {s['ttft_p95_s']:.2f} |")  # fmt: skip
    for o in outcomes:
        if o.error:
            print("failed:", o.error)


if __name__ == "__main__":
    main()
