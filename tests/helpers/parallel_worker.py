"""One rank of a parallel test run (tests/runtime/test_parallel.py starts two of these, as torchrun
would: RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT in the environment).

    python tests/helpers/parallel_worker.py JOBS.json OUT.pt

PARALLEL_TEST_DIE_AT_STEP=k makes a rank exit abruptly at greedy step k (the failure test).
JOBS.json: [{"path": ..., "mode": "tensor" | "pipeline", "tokens": [[...], ...],
"prompt": [...], "n": 8}, ...]. For each job every rank loads its share, computes the logits
of the batch (no cache) and n greedy tokens (prefill + decode with the KV cache); rank 0 saves
{index: {"logits": (B, T, V), "greedy": [...]}} to OUT.pt.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from clearlm.errors import ClearLMError
from clearlm.generation.loop import decode_step, new_cache, prefill
from clearlm.loading.checkpoint import open_checkpoint
from clearlm.runtime.parallel import launch
from clearlm.runtime.parallel.place import load_placed


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens: prefill, then decode steps against the (rank's) KV cache."""
    cache = new_cache(model, 1, len(prompt) + n)
    logits = prefill(model, torch.tensor([prompt]), cache)  # (1, V)
    out = []
    die_at = int(os.environ.get("PARALLEL_TEST_DIE_AT_STEP", "-1"))  # a rank killed mid-run
    for step in range(n):
        if step == die_at:
            os._exit(1)
        out.append(int(logits[0].argmax()))
        logits = decode_step(model, torch.tensor([[out[-1]]]), cache)
    return out


def main() -> None:
    jobs = json.loads(open(sys.argv[1]).read())
    results = {}
    for i, job in enumerate(jobs):
        n = 2
        sizes = {"tensor_parallel": n} if job["mode"] == "tensor" else {"pipeline_parallel": n}
        ckpt = open_checkpoint(job["path"])
        model = load_placed(ckpt, torch.float32, torch.device("cpu"), **sizes).model
        with torch.inference_mode():
            logits = model(torch.tensor(job["tokens"]))  # (B, T, V), no cache
        results[i] = {"logits": logits.cpu(), "greedy": greedy(model, job["prompt"], job["n"])}
    if launch.rank() == 0:
        torch.save(results, sys.argv[2])
    launch.shutdown()


if __name__ == "__main__":
    try:
        main()
    except ClearLMError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
