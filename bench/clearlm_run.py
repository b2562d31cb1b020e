"""One clearlm measurement in a fresh process, for bench/llamacpp.py (which reads its peak RSS).

    python bench/clearlm_run.py MODEL WEIGHTS THREADS [--precision highest|medium]
                                [--decode default|eager|compiled|aot] [--int8]
                                                                   →   one JSON line on stdout

--precision: the matmul precision, "highest" (default, exact float32) or "medium" (bfloat16
products for prefills: clearlm.runtime.precision). --decode compiled: the decode steps run
clearlm.runtime.compiled's step (torch.compile, Inductor's C++ wrapper), compiled during the warm-up
(its time reported apart as compile_s). --decode aot: clearlm.runtime.aot's ahead-of-time compiled
step, its package loaded during the warm-up (the load time joins load_s; a package this process
had to build first reports its build time as compile_s). --decode default: what a user gets
with no flag, ``clearlm.load(MODEL, threads=THREADS, decode="auto")`` (clearlm.api.decode: the
AOT step when ``clearlm compile MODEL`` has built its package, else eager while a background
build runs; bench/llamacpp.py builds the package first), decoding through the step the load
attached; ``"compiled"`` in the JSON says whether the timed steps ran compiled. --int8: compact
layers round decode activations to int8 (clearlm.quant.linear.set_int8_activations; opt-in,
not exact).

Measured as llama-bench measures (llama.cpp tools/llama-bench): after an untimed warm-up,
- load_s: seconds of ``clearlm.load(MODEL, weights=WEIGHTS, threads=THREADS)`` (file to usable
  model);
- pp512: 512 / seconds of one ``prefill`` of 512 token ids (seeded random ids in the
  vocabulary, like llama-bench's) into an empty KV cache;
- tg128: 128 / seconds of 128 decode steps from an empty cache, the first fed the BOS id, each
  next one a seeded random id (llama-bench's test_gen: it feeds ``rand() % n_vocab`` and samples
  nothing, so neither engine's time includes choosing a token).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import clearlm  # noqa: E402
from clearlm.api.options import parse_activations  # noqa: E402
from clearlm.errors import ClearLMError  # noqa: E402
from clearlm.generation.loop import decode_step, prefill  # noqa: E402
from clearlm.inspect.distance import cache_for  # noqa: E402
from clearlm.quant.linear import set_int8_activations  # noqa: E402
from clearlm.runtime.precision import set_matmul_precision  # noqa: E402
from clearlm.runtime.threads import set_threads  # noqa: E402

N_PROMPT, N_GEN = 512, 128


def main(model: str, weights: str, threads: int, precision: str = "highest",
         decode: str = "eager", int8: bool = False) -> dict[str, float | None]:
    t0 = time.perf_counter()
    auto = {"decode": "auto"} if decode == "default" else {}  # the CLI's default, env aside
    m = clearlm.load(model, weights=weights, threads=threads, **auto)
    set_matmul_precision(m.transformer, precision)  # what clearlm.load(matmul_precision=) does
    load_s = time.perf_counter() - t0
    net = m.transformer
    if int8:
        set_int8_activations(net)
    step = decode_step
    if decode == "default":  # the step clearlm.load attached (None: eager)
        step = getattr(net, "decode_fn", None) or decode_step
    elif decode == "compiled":
        from clearlm.runtime.compiled import CompiledDecodeStep

        step = CompiledDecodeStep(net)
    elif decode == "aot":
        from clearlm.runtime.aot import AOTDecodeStep

        step = AOTDecodeStep(net)
    vocab = m.config.vocab_size
    ids = torch.randint(0, vocab, (1, N_PROMPT), generator=torch.Generator().manual_seed(0))
    bos = m.tokenizer.bos_id if m.tokenizer.bos_id is not None else int(ids[0, 0])
    # warm-up: a short prefill and a few steps on a cache of the timed run's size (first calls
    # allocate, load the kernel; a compiled step compiles for that shape)
    warm = cache_for(net, N_GEN)
    prefill(net, ids[:, :16], warm)
    for i in range(4):
        step(net, ids[0, i].view(1, 1), warm)  # (1, 1) ids, as the timed steps feed
    del warm  # one cache at a time from here, as llama-bench keeps one context

    cache = cache_for(net, N_PROMPT)
    t = time.perf_counter()
    prefill(net, ids, cache)
    pp = N_PROMPT / (time.perf_counter() - t)

    cache = cache_for(net, N_GEN)
    feed = [torch.tensor([[bos]])] + [t.view(1, 1) for t in ids[0, 1:N_GEN]]  # (1, 1) each
    t = time.perf_counter()
    for token in feed:
        step(net, token, cache)  # (1, V) logits
    tg = N_GEN / (time.perf_counter() - t)
    compile_s = getattr(step, "compile_s", None)
    if decode in ("aot", "default") and compile_s is not None and not step.built:
        load_s, compile_s = load_s + compile_s, None  # loaded, not compiled: part of the load
    compiled = getattr(step, "loader", None) is not None or decode == "compiled"
    return {"load_s": load_s, "pp512": pp, "tg128": tg, "compile_s": compile_s,
            "compiled": compiled}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("weights", choices=["compact", "float32"])
    ap.add_argument("threads", type=int)
    ap.add_argument("--precision", choices=["highest", "medium"], default="highest")
    ap.add_argument("--decode", choices=["default", "eager", "compiled", "aot"],
                    default="eager")
    ap.add_argument("--int8", action="store_true")
    a = ap.parse_args()
    try:  # the library's own rules, before the load: int8 is a compact mode, threads in range
        parse_activations("int8" if a.int8 else None, a.weights)
        set_threads(a.threads)
    except ClearLMError as e:
        ap.error(str(e))
    try:
        print(json.dumps(main(a.model, a.weights, a.threads, a.precision, a.decode, a.int8)))
    except ClearLMError as e:  # a bad model path or file: one line, as the CLI says it
        sys.exit(f"error: {e}")
