"""One clearlm measurement in a fresh process, for bench/llamacpp.py (which reads its peak RSS).

    python bench/clearlm_run.py MODEL WEIGHTS THREADS [PRECISION]   →   one JSON line on stdout

PRECISION: the matmul precision, "highest" (default, exact float32) or "medium" (bfloat16
products for forwards of more than 4 rows: clearlm.precision).

Measured as llama-bench measures (llama.cpp tools/llama-bench): after an untimed warm-up,
- load_s: seconds of ``load_weights(MODEL, WEIGHTS, threads=THREADS)`` (file to usable model);
- pp512: 512 / seconds of one ``prefill`` of 512 token ids (seeded random ids in the
  vocabulary, like llama-bench's) into an empty KV cache;
- tg128: 128 / seconds of 128 ``decode_step`` calls from an empty cache, the first fed the BOS
  id, each next one the previous step's argmax.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from clearlm.generation import decode_step, prefill  # noqa: E402
from clearlm.precision import set_matmul_precision  # noqa: E402
from clearlm.quant.distance import cache_for  # noqa: E402
from clearlm.quant.weights import load_weights  # noqa: E402

N_PROMPT, N_GEN = 512, 128


def main(model: str, weights: str, threads: int, precision: str = "highest") -> dict[str, float]:
    t0 = time.perf_counter()
    m = load_weights(model, weights, threads=threads)
    set_matmul_precision(m.transformer, precision)  # what clearlm.load(matmul_precision=) does
    load_s = time.perf_counter() - t0
    net = m.transformer
    vocab = m.config.vocab_size
    ids = torch.randint(0, vocab, (1, N_PROMPT), generator=torch.Generator().manual_seed(0))
    bos = m.tokenizer.bos_id if m.tokenizer.bos_id is not None else int(ids[0, 0])
    # warm-up: a short prefill and a few steps (first calls allocate, load the kernel)
    warm = cache_for(net, 24)
    prefill(net, ids[:, :16], warm)
    for _ in range(4):
        decode_step(net, ids[:, :1], warm)

    cache = cache_for(net, N_PROMPT)
    t = time.perf_counter()
    prefill(net, ids, cache)
    pp = N_PROMPT / (time.perf_counter() - t)

    cache = cache_for(net, N_GEN)
    token = torch.tensor([[bos]], dtype=torch.long)  # (1, 1)
    t = time.perf_counter()
    for _ in range(N_GEN):
        logits = decode_step(net, token, cache)  # (1, V)
        token = logits.argmax(-1, keepdim=True)  # (1, 1)
    tg = N_GEN / (time.perf_counter() - t)
    return {"load_s": load_s, "pp512": pp, "tg128": tg}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])))
