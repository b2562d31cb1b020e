"""``clearlm serve`` against llama.cpp's ``llama-server`` on the same GGUF, under the same load.

Starts both servers on 127.0.0.1 (a free port each, ``--threads`` / ``-t`` the same):
- ``clearlm serve MODEL --max-batch CLIENTS`` with no decode flag: the default path, whose batches
  decode through the compiled batched step once it is built; ``clearlm compile MODEL --batch``
  builds it first (untimed), so the server loads it instead of building it in the background;
- ``llama-server -m MODEL -t T -tb T -np CLIENTS -c CLIENTS*CTX`` (one slot per client; built by
  bench/build_llamacpp.sh; no web UI).
Each gets one untimed warm-up request; then ``--rounds`` rounds alternate between them (the
order swapped every round). In a round, ``--clients`` concurrent clients share ``--requests``
streaming greedy ``/v1/completions`` (``max_tokens`` tokens, ``ignore_eos``, which both servers
accept, so every completion has that length); each prompt starts with its request number, so
neither server can reuse another request's prompt cache. Printed per round and as medians:
aggregate generated tokens/s (over the wall time from the first request to the last token),
requests/s, p50 / p95 time to first token, each server's peak RSS (VmHWM), and the ratios
clearlm / llama.cpp. Both servers are stopped at the end, also on an error or Ctrl-C; the whole
run is bounded by ``--timeout`` seconds.

Usage: ``python bench/serve_vs_llamacpp.py [--model ALIAS_OR_PATH] [--clients 8]
[--requests 32] [--max-tokens 64] [--rounds 3] [--threads 2] [--llama-server PATH]
[--timeout 1800]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from quantize_models import resolve, tool_path
from serve_load import PROMPTS, Outcome, cells, medians, summarize

ROOT = Path(__file__).resolve().parents[1]
CTX = 512  # tokens per llama-server slot: a prompt of ~10 tokens + max_tokens fits


async def one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> Outcome:
    """Stream one greedy completion (raw SSE, so that both servers' chunks read alike); never
    raises. Tokens: the final usage when the server sends it, else the chunks with text."""
    import json

    out = Outcome(prompt, 0)
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    t0 = time.perf_counter()
    parts, chunks = [], 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    out.completion_tokens = chunk["usage"].get("completion_tokens", 0)
                for c in chunk.get("choices") or []:
                    if c.get("text"):
                        if not parts:
                            out.ttft_s = time.perf_counter() - t0
                        parts.append(c["text"])
                        chunks += 1
        out.text = "".join(parts)
        out.completion_tokens = out.completion_tokens or chunks
    except Exception as e:  # counted as a failure
        out.error = f"{type(e).__name__}: {e}"
    out.total_s = time.perf_counter() - t0
    return out


async def load(url: str, n_clients: int, n_requests: int, max_tokens: int, timeout: float):
    """n_clients clients at once taking the n_requests requests in turn (request i: "i. " +
    PROMPTS[i % len]). Returns (outcomes in request order, wall seconds)."""
    queue = list(range(n_requests))
    done: dict[int, Outcome] = {}
    # a new connection per request: a kept-alive one that the server has closed meanwhile
    # (llama-server closes idle ones) would fail the next request on it
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def worker() -> None:
            while queue:
                i = queue.pop(0)
                done[i] = await one(client, url, f"{i}. {PROMPTS[i % len(PROMPTS)]}", max_tokens)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(n_clients)))
        wall = time.perf_counter() - t0
    return [done[i] for i in range(n_requests)], wall


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, cmd: list[str], port: int, env: dict, deadline: float):
    """Start a server; return (process, base URL, log file) once /health answers 200.
    Exits naming the server and its log's last line when it stops or does not start."""
    log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = (Path(log.name).read_text(errors="replace").strip().splitlines() or ["?"])[-1]
            raise SystemExit(f"error: {name} exited ({proc.returncode}): {last} (log {log.name})")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log.name
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"error: {name} did not start in time (log {log.name})")


def peak_rss_mib(pid: int) -> float:
    """VmHWM of a live process, MiB (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return 0.0


def compile_batch(path: Path, threads: int) -> None:
    """``clearlm compile PATH --batch``: the package the default server loads (quick when built)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("CLEARLM_DECODE", None)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "clearlm", "compile", str(path), "--batch",
                           "--threads", str(threads), "--quiet"], env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        sys.exit(f"error: clearlm compile --batch failed: "
                 f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    print(f"[compile --batch] {path.name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)


def servers(args, path: Path, binary: str, deadline: float) -> dict[str, tuple]:
    """Start both servers (clearlm's default path, llama-server); name → (process, URL, log)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("CLEARLM_DECODE", None)  # the default decode mode, as a user gets it
    p1, p2 = free_port(), free_port()
    out = {}
    out["clearlm"] = start("clearlm", [
        sys.executable, "-m", "clearlm", "serve", str(path), "--host", "127.0.0.1", "--port",
        str(p1), "--name", "m", "--threads", str(args.threads), "--max-batch", str(args.clients),
    ], p1, env, deadline)  # fmt: skip
    out["llama.cpp"] = start("llama-server", [
        binary, "-m", str(path), "--host", "127.0.0.1", "--port", str(p2), "-t",
        str(args.threads), "-tb", str(args.threads), "-np", str(args.clients), "-c",
        str(args.clients * CTX), "-a", "m",
    ], p2, os.environ.copy(), deadline)  # fmt: skip
    return out


def row(i, name: str, s: dict, rss: float) -> str:
    return f"| {i} | {name} | {cells(s)} | {rss:,.0f} | {s['failures']} |"


def report(runs: dict[str, list[dict]], rss: dict[str, float], texts: dict[str, list[str]]):
    """The medians table and the clearlm / llama.cpp ratios."""
    med = medians(runs)
    print("\n| server | tokens/s | requests/s | TTFT p50 (s) | TTFT p95 (s) | peak RSS (MiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, s in med.items():
        print(f"| {n} | {cells(s)} | {rss[n]:,.0f} |")
    c, llama = med["clearlm"], med["llama.cpp"]

    def ratio(k: str) -> str:
        return f"{c[k] / llama[k]:.2f}×" if llama[k] else "-"

    same = sum(a == b for a, b in zip(texts["clearlm"], texts["llama.cpp"], strict=True))
    print(f"\nclearlm / llama.cpp (medians): tokens/s {ratio('tokens_per_s')}, requests/s "
          f"{ratio('requests_per_s')}, TTFT p50 {ratio('ttft_p50_s')}, TTFT p95 "
          f"{ratio('ttft_p95_s')}, peak RSS {rss['clearlm'] / max(rss['llama.cpp'], 1):.2f}×; "
          f"{same} of {len(texts['clearlm'])} completions the same text in both")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="alias or GGUF path")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", help="a llama-server binary (default: build/cache one)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for the whole run")
    args = ap.parse_args()
    for k in ("clients", "requests", "max_tokens", "rounds", "threads"):
        if getattr(args, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1, got {getattr(args, k)}")
    deadline = time.monotonic() + args.timeout
    path = resolve([args.model])[0]
    binary = args.llama_server or tool_path("llama-server")
    compile_batch(path, args.threads)
    print(f"{path.name}: {args.clients} clients, {args.requests} greedy completions of "
          f"{args.max_tokens} tokens per round, {args.threads} threads, {args.rounds} rounds")
    procs: dict[str, tuple] = {}
    runs: dict[str, list[dict]] = {"clearlm": [], "llama.cpp": []}
    texts: dict[str, list[str]] = {}
    try:
        procs = servers(args, path, binary, deadline)
        for _, url, _ in procs.values():  # warm-up, untimed
            asyncio.run(load(url, 1, 1, 8, max(1.0, deadline - time.monotonic())))
        print("| round | server | tokens/s | requests/s | TTFT p50 (s) | TTFT p95 (s) | "
              "peak RSS (MiB) | failures |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for i in range(args.rounds):
            order = list(procs) if i % 2 == 0 else list(procs)[::-1]
            for name in order:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                proc, url, _ = procs[name]
                outcomes, wall = asyncio.run(asyncio.wait_for(
                    load(url, args.clients, args.requests, args.max_tokens, left), left))
                s = summarize(outcomes, wall)
                runs[name].append(s)
                texts.setdefault(name, [o.text for o in outcomes])
                print(row(i + 1, name, s, peak_rss_mib(proc.pid)), flush=True)
                for o in [o for o in outcomes if o.error][:3]:
                    print(f"  failed: {o.error}", file=sys.stderr)
        rss = {n: peak_rss_mib(p.pid) for n, (p, _, _) in procs.items()}
        report(runs, rss, texts)
    except TimeoutError:
        sys.exit(f"error: --timeout {args.timeout:.0f} s reached; partial rounds above")
    finally:
        for proc, _, log in procs.values():
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            Path(log).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
