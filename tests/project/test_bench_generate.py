"""bench/generate.py on a tiny GGUF (no transformers run): the weights it runs are the ones
asked for and named in the table's header, and the bytes per decode step it divides the
bandwidth by are those of the file's tensors as held (packed or float32)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from tiny_gguf import write_tiny_llama

from clearlm.api.options import parse_weights
from clearlm.errors import ClearLMError

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "generate.py"
spec = importlib.util.spec_from_file_location("bench_generate", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[bool, Path]:
    d = tmp_path_factory.mktemp("bench-gen")
    q8 = GGMLQuantizationType.Q8_0
    return {tied: write_tiny_llama(d / f"{tied}.gguf", tied=tied, matrix_type=q8)
            for tied in (True, False)}  # fmt: skip


def read_per_token(path: Path, weights: str) -> int:
    """From the file itself: every tensor once (Q8_0 blocks as stored for compact, 4 bytes a
    value for float32); an untied token_embd is not multiplied, only one of its rows read."""
    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    size = {n: int(t.n_bytes) if weights == "compact" else 4 * int(t.n_elements)
            for n, t in tensors.items()}  # fmt: skip
    embed = size["token_embd.weight"]
    rows = int(tensors["token_embd.weight"].shape[-1])  # gguf lists dims fastest first
    untied = "output.weight" in tensors
    return sum(size.values()) - (embed if untied else 0) + embed // rows


@pytest.mark.parametrize("weights", ["compact", "float32"])
@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_are_the_files_tensors_as_held(files, weights, tied):
    m, *_, held = bench.load_clearlm(files[tied], "float32", weights)
    assert held == weights  # Model.weights: the mode the model got
    got = bench.weight_bytes(m, m.embed_tokens, m.lm_head, m.config.vocab_size)
    assert got == read_per_token(files[tied], weights)


@pytest.mark.parametrize("weights", ["compact", "float32"])
def test_the_child_runs_the_weights_asked_for_and_the_header_names_them(files, weights, capsys):
    args = dict(engine="clearlm", model_path=str(files[True]), ids=[104, 101, 108, 108],
                new_tokens=5, dtype="float32", weights=weights)  # fmt: skip
    bench.child(argparse.Namespace(**args))
    c = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert c["weights"] == weights and len(c["tokens"]) == 5
    t = dict(dtype="float32", weights="float32", attn="sdpa")  # what transformers' child says
    assert bench.columns(c, t) == [
        "metric",
        f"clearlm (float32, {weights} weights)",
        "transformers (float32, float32 weights, sdpa)",
        "clearlm / transformers",
    ]


def test_weights_that_clearlm_refuses_end_with_one_line_before_any_run():
    run = [sys.executable, str(SCRIPT), "--dtype", "bfloat16", "--weights", "compact"]
    r = subprocess.run(run, capture_output=True, text=True, timeout=120)
    with pytest.raises(ClearLMError) as e:  # clearlm.load's own refusal, word for word
        parse_weights("compact", torch.bfloat16)
    assert r.returncode == 1 and r.stderr.strip() == f"error: {e.value}", r.stderr
    r = subprocess.run([*run[:2], "--weights", "int4"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice: 'int4'" in r.stderr
