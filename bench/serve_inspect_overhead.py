"""What ``clearlm serve --inspect`` costs the requests that never ask for an inspection.

Two servers on one loaded model in this process (uvicorn threads on 127.0.0.1), one without and
one with ``--inspect`` (:class:`~clearlm.serve.inspect_store.InspectStore`), each with its own
batching engine. The same ``--requests`` streaming completions (fixed prompts and seeds, sent
together through the official client, as bench/serve_load.py sends them) go to one, then the
other, alternately for ``--rounds`` rounds each, after a warm-up round on both. Printed: the
median wall time and process CPU time (all threads: the machine's other load counts less
there) of a round and the median time to first token per server, their ratio, and
the ratio within each round (the two runs of a round are next to each other in time, so a load
that comes and goes on the machine skews a pair less than the medians);
the answers of both servers must be equal (recording changes no token).

Then the recording alone, timed directly: :func:`clearlm.serve.inspect_api.recorder` on a
finished session of ``--max-tokens`` tokens (the one thing --inspect adds to a request),
in microseconds per request. Usage: ``.venv/bin/python bench/serve_inspect_overhead.py
[--model ALIAS] [--requests 32] [--rounds 5] [--max-tokens 32] [--threads N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import run_load, serve_in_thread  # noqa: E402 (bench/ is not a package)


def recording_us(max_tokens: int, prompt_tokens: int = 8, repeats: int = 2000) -> float:
    """Microseconds to record one finished one-choice request (the ids copied into the store,
    the least recently used record dropped past ``keep``)."""
    from clearlm.engine import TokenEvent
    from clearlm.serve.inspect_api import recorder
    from clearlm.serve.inspect_store import InspectStore, key_digest

    store = InspectStore()
    events = [TokenEvent("r", 100 + i, -1.0) for i in range(max_tokens)]
    record = recorder(store, key_digest(b"key"))
    sessions = [
        SimpleNamespace(id=f"cmpl-{i}", prompt_of=[0],
                        job=SimpleNamespace(prompts=[list(range(prompt_tokens))]),
                        choices=[SimpleNamespace(index=0, events=events)])
        for i in range(repeats)
    ]  # fmt: skip
    t0 = time.perf_counter()
    for s in sessions:
        record(s)  # type: ignore[arg-type]
    return (time.perf_counter() - t0) / repeats * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    import clearlm
    from clearlm.serve import create_app
    from clearlm.serve.inspect_store import InspectStore

    model = clearlm.load(args.model, threads=args.threads)
    servers = {
        "off": serve_in_thread(create_app(model, model_id="m")),
        "on": serve_in_thread(create_app(model, model_id="m", inspect=InspectStore())),
    }
    walls: dict[str, list[float]] = {"off": [], "on": []}
    cpus: dict[str, list[float]] = {"off": [], "on": []}  # this process's CPU s (all threads)
    ttfts: dict[str, list[float]] = {"off": [], "on": []}
    texts: dict[str, list[str]] = {}
    for r in range(args.rounds + 1):  # round 0 warms both up and is not counted
        for name in ("off", "on") if r % 2 else ("on", "off"):
            url = servers[name][0]
            cpu0 = time.process_time()
            outs, wall = asyncio.run(run_load(url, "m", args.requests, 1, args.max_tokens))
            cpu = time.process_time() - cpu0
            failed = [o.error for o in outs if o.error]
            assert not failed, failed
            texts[name] = [o.text for o in outs]
            if r:
                walls[name].append(wall)
                cpus[name].append(cpu)
                ttfts[name] += [o.ttft_s for o in outs]
    for _, server, thread in servers.values():
        server.should_exit = True  # type: ignore[attr-defined]
        thread.join()
    assert texts["on"] == texts["off"], "the two servers answered differently"

    off, on = statistics.median(walls["off"]), statistics.median(walls["on"])
    print(f"{args.model}: {args.requests} streaming completions at once, max_tokens "
          f"{args.max_tokens}, {args.rounds} rounds per server, alternating")  # fmt: skip
    print("| server | round wall, median (s) | rounds (s) | CPU s per round, median | "
          "TTFT median (s) |")  # fmt: skip
    print("|---|---:|---|---:|---:|")
    for name, label in (("off", "without --inspect"), ("on", "with --inspect")):
        rounds = " ".join(f"{w:.2f}" for w in walls[name])
        print(f"| {label} | {statistics.median(walls[name]):.3f} | {rounds} | "
              f"{statistics.median(cpus[name]):.2f} | {statistics.median(ttfts[name]):.3f} |")
    pairs = [b / a for a, b in zip(walls["off"], walls["on"], strict=True)]  # same round
    print(f"with / without: {on / off:.3f} (medians); per round, side by side: "
          f"{' '.join(f'{x:.3f}' for x in pairs)}, median {statistics.median(pairs):.3f}")
    us = recording_us(args.max_tokens)
    print(f"recording one finished request ({args.max_tokens} tokens): {us:.1f} us "
          f"({us * args.requests / 1e6 / off * 100:.4f}% of a round's wall time for "
          f"{args.requests} requests)")  # fmt: skip


if __name__ == "__main__":
    main()
