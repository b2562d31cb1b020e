"""Where ``clearlm serve``'s wall time goes under concurrent streaming load, per engine step.

Starts the server's default path in this process (the model as ``clearlm serve`` loads it, the
continuous-batching engine with ``--max-batch CLIENTS``, the compiled batched decode step built
or loaded first; uvicorn in a thread on 127.0.0.1), wraps the engine's parts with timers, and
runs the load of bench/serve_vs_llamacpp.py (``--clients`` concurrent clients sharing
``--requests`` streaming greedy ``/v1/completions`` of ``--max-tokens`` tokens, ignore_eos) in
a separate process, so that the client does not share this process's GIL. One untimed warm-up
request first. Prints, per engine step: the mean milliseconds in the decode forward pass
(compiled step or eager), sampling, prefill, admission and the rest of ``step()``; the time
between steps (delivering events, waiting for the lock or the GIL, idle); the rows each decode
pass carried (a histogram); and the CPU seconds of each thread of the process (the engine
thread, the event loop, torch's workers) over the timed load.

Usage: ``python bench/serve_profile.py [--model ALIAS_OR_PATH] [--clients 8] [--requests 32]
[--max-tokens 64] [--threads 2] [--decode compiled|eager]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENT = """
import asyncio, json, sys
sys.path.insert(0, {bench!r})
from serve_vs_llamacpp import load
from serve_load import summarize
out, wall = asyncio.run(load({url!r}, {clients}, {requests}, {max_tokens}, 600))
print(json.dumps(summarize(out, wall)))
"""


class Timers:
    """Named sums of seconds and counts."""

    def __init__(self) -> None:
        self.s: dict[str, float] = collections.defaultdict(float)
        self.n: dict[str, int] = collections.defaultdict(int)

    def wrap(self, name: str, fn):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.s[name] += time.perf_counter() - t
                self.n[name] += 1

        return timed


def thread_cpu(names: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads: those in ``names`` (native id →
    label) by label, the others (torch's worker threads) together as "other threads"."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = collections.defaultdict(float)
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[names.get(int(tid), "other threads")] += (int(fields[11]) + int(fields[12])) / tick
    return out


def instrument(engine, runner, timers: Timers, rows: collections.Counter) -> None:
    """Wrap the engine's parts (instance attributes, so only this engine is timed)."""
    from clearlm.engine import running

    net = engine.model
    step_fn = getattr(net, "batch_decode_fn", None)
    if step_fn is not None:
        net.batch_decode_fn = timers.wrap("decode forward (compiled)", step_fn)
    decode, prefill = engine.decode, engine.prefill

    def counted_decode():
        n = sum(s.pending is not None for s in engine.running.values())
        if n:
            rows[n] += 1
        return decode()

    engine.decode = timers.wrap("decode (all)", counted_decode)
    engine.prefill = timers.wrap("prefill", prefill)
    engine.admit = timers.wrap("admit", engine.admit)
    engine.step = timers.wrap("step", engine.step)
    running.Running.sample = timers.wrap("sample", running.Running.sample)
    runner.add = timers.wrap("runner.add (a worker thread)", runner.add)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode", default="compiled", choices=["compiled", "eager"])
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from serve_load import serve_in_thread

    from clearlm.cli.loader import load_model
    from clearlm.cli.serve import set_batch_decode
    from clearlm.engine.scheduler import build_engine
    from clearlm.serve import create_app

    m = load_model(args.model, threads=args.threads, quiet=True)
    engine = build_engine(m.transformer, m.tokenizer.eos_ids, args.clients)
    set_batch_decode(m, args.decode, quiet=True)
    app = create_app(m, engine, model_id="m")
    url, server, thread = serve_in_thread(app)
    runner = app.state.runner
    base = url.removesuffix("/v1")

    def client(clients: int, requests: int, max_tokens: int) -> dict:
        code = CLIENT.format(bench=str(ROOT / "bench"), url=base, clients=clients,
                             requests=requests, max_tokens=max_tokens)  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"error: the load client failed: {out.stderr.strip()[-400:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    client(1, 1, 8)  # warm-up, untimed
    timers, rows = Timers(), collections.Counter()
    instrument(engine, runner, timers, rows)
    names = {runner.thread.native_id: "engine thread", thread.native_id: "event loop",
             threading.main_thread().native_id: "main (idle)"}  # fmt: skip
    cpu0, t0 = thread_cpu(names), time.perf_counter()
    s = client(args.clients, args.requests, args.max_tokens)
    wall, cpu1 = time.perf_counter() - t0, thread_cpu(names)
    server.should_exit = True
    thread.join()
    steps = timers.n["step"] or 1
    print(f"{args.model}, decode {args.decode}: {args.clients} clients, {args.requests} "
          f"completions of {args.max_tokens} tokens, {args.threads} threads; "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"tokens/s {s['tokens_per_s']:.1f}, TTFT p50 {s['ttft_p50_s']:.2f} s, p95 "
          f"{s['ttft_p95_s']:.2f} s, wall {wall:.1f} s, {steps} engine steps")  # fmt: skip
    print("\n| part | ms per step | calls | ms per call | share of wall |")
    print("|---|---:|---:|---:|---:|")
    between = wall - timers.s["step"]
    parts = [*timers.s.items(), ("between steps", between)]
    for name, sec in parts:
        if name.startswith("runner.add"):
            continue
        calls = timers.n.get(name, steps)
        print(f"| {name} | {1e3 * sec / steps:.2f} | {calls} | {1e3 * sec / max(calls, 1):.2f} "
              f"| {sec / wall:.0%} |")  # fmt: skip
    total = sum(rows.values()) or 1
    mean = sum(k * v for k, v in rows.items()) / total
    print(f"\nrows per decode pass (mean {mean:.2f}):",
          ", ".join(f"{k}: {v}" for k, v in sorted(rows.items())))  # fmt: skip
    adds = timers.n["runner.add (a worker thread)"] or 1
    print(
        f"\nrunner.add (waits for the engine's lock): {adds} calls, "
        f"{1e3 * timers.s['runner.add (a worker thread)'] / adds:.1f} ms each"
    )
    print("\nCPU seconds by thread over the load:",
          ", ".join(f"{k} {cpu1[k] - cpu0.get(k, 0):.1f}" for k in sorted(cpu1)
                    if cpu1[k] - cpu0.get(k, 0) >= 0.05))  # fmt: skip


if __name__ == "__main__":
    main()
