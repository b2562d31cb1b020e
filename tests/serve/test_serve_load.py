"""A bounded load test: many concurrent streaming requests through ``clearlm serve`` (the
functions of bench/serve_load.py), zero failures, each response equal to its unbatched run
(the same prompt and seed through ``model.generate``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.serve import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import serve_load  # noqa: E402


def check_load(model: clearlm.Model, concurrency: int, rounds: int, max_tokens: int) -> dict:
    with serving(create_app(model, model_id="m")) as url:
        outcomes, wall = asyncio.run(
            serve_load.run_load(url, "m", concurrency, rounds, max_tokens, temperature=0.8)
        )
    assert [o.error for o in outcomes] == [None] * concurrency * rounds
    for o in outcomes:
        want = model.generate(o.prompt, max_new_tokens=max_tokens, temperature=0.8, seed=o.seed)
        assert (o.text, o.completion_tokens) == (want.text, len(want.tokens)), o
        assert o.finish_reason == ("length" if want.finish_reason == "length" else "stop")
    stats = serve_load.summarize(outcomes, wall)
    assert stats["failures"] == 0 and stats["requests"] == concurrency * rounds
    assert 0 < stats["ttft_p50_s"] <= stats["ttft_p95_s"]
    return stats


def test_32_concurrent_streams_3_rounds_tiny(tmp_path):
    model = clearlm.load(write_tiny_llama(tmp_path / "t.gguf", context_length=128))
    check_load(model, concurrency=32, rounds=3, max_tokens=16)


def test_8_concurrent_streams_smollm2(smollm2):
    check_load(smollm2, concurrency=8, rounds=1, max_tokens=6)
