"""Generation speed and memory: clearlm against transformers (float32 eager) on the default model.

What is measured, per engine, on the default model (SmolLM2-135M-Instruct, Q4_1 GGUF).
transformers dequantizes it to float32 at load; clearlm holds its weights as ``--weights`` says
(default: ``clearlm.load``'s, compact with float32: the block-quantized matrices stay packed;
``float32``: dequantized as transformers does), and the table's header names them:
- load time: seconds to build the model from the GGUF file (clearlm's includes its tokenizer);
- prefill: tokens/s of one forward pass over a P-token prompt (default 512) into an empty KV
  cache, keeping only the last position's logits (clearlm ``last_only``, transformers
  ``logits_to_keep=1``, which is what ``generate`` passes);
- decode: tokens/s of N - 1 cached single-token steps (default N = 128, so 127 steps), greedy
  argmax, never stopping at EOS. Both engines run the same hand-written loop (no ``generate``),
  so each time covers the forward pass and the argmax only;
- peak RSS (MiB): ``ru_maxrss`` at the end of the engine's own process;
- decode as a fraction of the memory-bandwidth ceiling: bandwidth / weight bytes read per token
  (every matrix once, packed or float as held: a tied embedding counts once, as lm_head, plus
  the one row looked up).

How: the prompt is tests/data/alice.txt repeated and cut to exactly P ids by clearlm's tokenizer;
both engines get the same ids. Each repeat runs each engine in a fresh subprocess (this script
with ``--json SPEC``), alternating clearlm, transformers, clearlm, ...; a subprocess
loads the model, does one untimed warm-up (the same prompt, 4 new tokens), then one timed run.
Tables report medians over the repeats. Torch's default thread count is kept for both.
Usage: ``.venv/bin/python bench/generate.py [--repeats 3] [--dtype bfloat16]
[--weights compact|float32] [--markdown]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
ALICE = ROOT / "tests" / "data" / "alice.txt"
BANDWIDTH_GBS = 20.0  # notes/references.md: read bandwidth here with 2 threads
ENGINES = ("clearlm", "transformers")
TIMED = ("load_s", "prefill_tps", "decode_tps", "rss_mib")  # per-run numbers, reported as medians

Step = Callable[..., Any]


def prompt_ids(path: Path, n: int) -> list[int]:
    """Exactly n token ids of alice.txt, repeated as often as needed (clearlm's tokenizer)."""
    from clearlm.loading.gguf import open_gguf, read_metadata
    from clearlm.tokenizer import tokenizer_from_gguf

    tok = tokenizer_from_gguf(read_metadata(open_gguf(path)), source=path.name)
    text = ALICE.read_text()
    reps = n // len(tok.encode(text)) + 2
    ids = tok.encode("\n\n".join([text] * reps))[:n]
    assert len(ids) == n, f"could only build {len(ids)} prompt tokens"
    return ids


def storages(module: torch.nn.Module) -> dict[int, int]:
    """Address → bytes of every weight storage of ``module`` (parameters and persistent buffers,
    such as a compact layer's codes and scales), each shared storage once; empty ones left out
    (they all sit at address 0)."""
    out = {}
    for t in (*module.parameters(), *module.state_dict().values()):
        s = t.untyped_storage()
        if s.nbytes() > 0:
            out[s.data_ptr()] = s.nbytes()
    return out


def weight_bytes(
    model: torch.nn.Module, embed: torch.nn.Module, head: torch.nn.Module, vocab: int
) -> int:
    """Bytes of weights one decode step reads: all matrices once (as held: float or packed),
    one embedding row (the embedding's bytes / vocab rows)."""
    held, e = storages(model), storages(embed)
    total = sum(held.values())  # a tied head shares the embedding's storage: counted once
    if not e.keys() & storages(head).keys():  # untied: the embedding is only looked up
        total -= sum(e.values())
    return total + sum(e.values()) // vocab


Loaded = tuple[torch.nn.Module, Step, Step, int, str]  # model, prefill, decode, bytes, weights


def load_clearlm(path: Path, dtype: str, weights: str) -> Loaded:
    import clearlm
    from clearlm.generation.loop import decode_step, new_cache, prefill

    model = clearlm.load(path, dtype=getattr(torch, dtype), weights=weights)
    m = model.transformer

    def pre(ids: torch.Tensor, max_len: int) -> tuple[torch.Tensor, Any]:
        cache = new_cache(m, 1, max_len)  # static buffers, sized to prompt + new tokens
        return prefill(m, ids, cache), cache  # (1, V)

    def dec(tok: torch.Tensor, cache: Any) -> torch.Tensor:
        return decode_step(m, tok, cache)  # (1, V)

    nbytes = weight_bytes(m, m.embed_tokens, m.lm_head, m.config.vocab_size)
    return m, pre, dec, nbytes, model.weights  # what the model holds (Model.weights)


def load_transformers(path: Path, dtype: str, weights: str) -> Loaded:
    """transformers' model, dequantized to float32 whatever ``dtype`` and ``weights`` say."""
    from transformers import AutoModelForCausalLM, DynamicCache

    m = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    m.eval()

    @torch.inference_mode()
    def pre(ids: torch.Tensor, max_len: int) -> tuple[torch.Tensor, Any]:
        cache = DynamicCache(config=m.config)  # grows by concatenation, as in generate
        out = m(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], cache  # (1, V)

    @torch.inference_mode()
    def dec(tok: torch.Tensor, cache: Any) -> torch.Tensor:
        out = m(input_ids=tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]  # (1, V)

    embed, head = m.get_input_embeddings(), m.get_output_embeddings()
    return m, pre, dec, weight_bytes(m, embed, head, m.config.vocab_size), "float32"


def timed_run(pre: Step, dec: Step, ids: torch.Tensor, n_new: int) -> tuple[float, float, list]:
    """Prefill + (n_new - 1) greedy decode steps → (prefill s, decode s, the n_new tokens)."""
    t0 = time.perf_counter()
    logits, cache = pre(ids, ids.shape[1] + n_new)
    tok = logits.argmax(-1, keepdim=True)  # (1, 1)
    t1 = time.perf_counter()
    out = [int(tok)]
    for _ in range(n_new - 1):
        tok = dec(tok, cache).argmax(-1, keepdim=True)  # (1, 1)
        out.append(int(tok))
    return t1 - t0, time.perf_counter() - t1, out


def child(args: argparse.Namespace) -> None:
    """One engine in this process: load, warm up, time one run, print a JSON line."""
    ids = torch.tensor([args.ids], dtype=torch.long)  # (1, P)
    loader = load_clearlm if args.engine == "clearlm" else load_transformers
    dtype = args.dtype if args.engine == "clearlm" else "float32"
    t0 = time.perf_counter()
    model, pre, dec, nbytes, weights = loader(Path(args.model_path), dtype, args.weights)
    load_s = time.perf_counter() - t0
    timed_run(pre, dec, ids, 4)  # warm-up: first-call allocations and kernel selection
    prefill_s, decode_s, tokens = timed_run(pre, dec, ids, args.new_tokens)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    attn = getattr(getattr(model, "config", None), "_attn_implementation", "sdpa")
    out = dict(load_s=load_s, prefill_tps=ids.shape[1] / prefill_s, rss_mib=rss_mib)
    out |= dict(decode_tps=(args.new_tokens - 1) / decode_s, weight_bytes=nbytes, dtype=dtype)
    out |= dict(weights=weights)
    print(json.dumps(out | dict(threads=torch.get_num_threads(), attn=attn, tokens=tokens)))


def run_engine(engine: str, args: argparse.Namespace, path: Path, ids: list[int]) -> dict:
    spec = dict(engine=engine, model_path=str(path), ids=ids, new_tokens=args.new_tokens)
    spec |= dict(dtype=args.dtype, weights=args.weights)
    cmd = [sys.executable, __file__, "--json", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{engine} subprocess failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def columns(c: dict, t: dict) -> list[str]:
    """The table's header from the engines' first runs: each engine's dtype and weights."""
    return [
        "metric",
        f"clearlm ({c['dtype']}, {c['weights']} weights)",
        f"transformers ({t['dtype']}, {t['weights']} weights, {t['attn']})",
        "clearlm / transformers",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="clearlm's")
    p.add_argument("--weights", choices=["compact", "float32"], default=None,
                   help="clearlm's (default: clearlm.load's, compact with float32)")  # fmt: skip
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument("--json", help=argparse.SUPPRESS)  # child: run one engine, print JSON
    args = p.parse_args()
    if args.json:
        return child(argparse.Namespace(**json.loads(args.json)))

    from rich.console import Console
    from rich.table import Table

    from clearlm.api.options import parse_weights
    from clearlm.errors import ClearLMError
    from clearlm.store.catalog import resolve_model

    try:  # the mode clearlm.load picks (or refuses: compact with bfloat16), before any run
        args.weights = parse_weights(args.weights, getattr(torch, args.dtype))
    except ClearLMError as e:
        sys.exit(f"error: {e}")
    console = Console(width=max(Console().width, 120))
    path = resolve_model()
    ids = prompt_ids(path, args.prompt_tokens)
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    for r in range(args.repeats):
        for engine in ENGINES:  # alternate, so slow drifts in machine speed hit both
            console.print(f"repeat {r + 1}/{args.repeats}: {engine} …", style="dim")
            runs[engine].append(run_engine(engine, args, path, ids))
    load_after = os.getloadavg()

    c, t = runs["clearlm"][0], runs["transformers"][0]  # non-timing fields: same every repeat
    m = {e: {k: statistics.median(r[k] for r in runs[e]) for k in TIMED} for e in ENGINES}
    for e in ENGINES:
        m[e]["ceiling"] = BANDWIDTH_GBS * 1e9 / runs[e][0]["weight_bytes"]
        m[e]["of_ceiling"] = 100 * m[e]["decode_tps"] / m[e]["ceiling"]
    rows = [  # (metric, key, format)
        ("load time (s)", "load_s", ".2f"),
        (f"prefill tok/s ({args.prompt_tokens}-token prompt)", "prefill_tps", ".0f"),
        (f"decode tok/s ({args.new_tokens} new tokens)", "decode_tps", ".1f"),
        ("decode ceiling tok/s (bandwidth / weight bytes)", "ceiling", ".1f"),
        ("decode / ceiling (%)", "of_ceiling", ".0f"),
        ("peak RSS (MiB)", "rss_mib", ".0f"),
    ]
    head = columns(c, t)
    a, b = m["clearlm"], m["transformers"]
    cells = [[n, f"{a[k]:{f}}", f"{b[k]:{f}}", f"{a[k] / b[k]:.2f}"] for n, k, f in rows]
    table = Table(title=f"Generation, {path.name}, median of {args.repeats} repeats")
    for i, h in enumerate(head):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in cells:
        table.add_row(*row)
    console.print(table)

    pairs = enumerate(zip(c["tokens"], t["tokens"], strict=True))
    same = next((i for i, (a, b) in pairs if a != b), None)
    notes = [
        f"Median of {args.repeats} repeats; each engine runs in its own subprocess per repeat "
        "(load, one warm-up, one timed run), alternating clearlm, transformers. Ratio > 1 is "
        "better for tok/s, < 1 for time and memory.",
        f"torch threads: {c['threads']} (clearlm), {t['threads']} (transformers); "
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min).",
        "Both: prefill = one forward pass of the prompt into an empty cache, last-position logits "
        "only (clearlm last_only, transformers logits_to_keep=1); decode = hand-written greedy "
        "loop, argmax per step, no EOS stop, no logits processors.",
        "clearlm: static KV buffers preallocated to prompt + new tokens; transformers: "
        "DynamicCache (concatenates per step), the model's default attention "
        f"({t['attn']}). Load time: clearlm includes building its tokenizer.",
        f"Ceiling: {BANDWIDTH_GBS:.0f} GB/s / weight bytes per token "
        f"({c['weight_bytes'] / 1e6:.0f} MB clearlm, {t['weight_bytes'] / 1e6:.0f} MB "
        "transformers); the KV cache read, which grows with the context, is not counted.",
        f"Greedy tokens: {'identical' if same is None else f'first differ at new token {same}'}"
        f" over {args.new_tokens} (first repeat).",
    ]
    for n in notes:
        console.print(f"- {n}", style="dim", highlight=False)
    if args.markdown:
        lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * 3 + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        print("\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    main()
