"""`clearlm diff A B PROMPT`: the --json object, the picture, the refusals, on the real SmolLM2
(compact against float32 weights of one file) and on tiny models."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from cli_in_process import run_clearlm
from tiny_gguf import write_tiny_llama
from typer.testing import CliRunner

import clearlm
from clearlm.cli import app

# 12 tokens: at most 16 rows, compact layers multiply with their kernel (another summation order
# than float32's); longer prompts dequantize a band at a time and match float32 exactly
# (clearlm.quant.linear, SMALL_M)
PROMPT = "The capital of France is Paris. The capital of Italy is"


def cli(*args: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (a subprocess spends
    ~2.5 s importing torch; what is checked here is what a command prints and returns)."""
    return run_clearlm(*args, text=True)


def test_json_on_smollm2_compact_against_float32(smollm2, smollm2_path, tmp_path):
    """Compact weights hold the file's values and sum in another order: every point differs
    from float32 by a little, no block passes the threshold, and the top-1 agreement is the one
    computed here from the two models' own logits."""
    png = tmp_path / "diff.png"
    # the thread count of this process: float32 matmuls sum in an order that depends on it, and
    # the CLI's default (the free cores) drops on a busy machine
    proc = cli("diff", str(smollm2_path), str(smollm2_path), PROMPT, "--weights", "float32",
               "--weights", "compact", "--json", "--plot", str(png), "-q",
               "--threads", str(torch.get_num_threads()))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    n = len(smollm2.encode(PROMPT))
    assert out["weights"] == ["float32", "compact"] and out["tokens"] == smollm2.encode(PROMPT)
    assert out["points"] == ["attn.out", "resid_mid", "ffn.out", "resid_post"]
    assert len(out["layers"]) == 30 and out["threshold"] == 0.01
    for layer in out["layers"]:
        for point in out["points"]:
            assert len(layer[point]["per_position"]) == n
    worst = max(layer["resid_post"]["max"] for layer in out["layers"])
    assert 0 < worst < 1e-3 and out["first_layer"] is None
    assert out["embed"]["max"] == 0.0  # the embedding is looked up, not multiplied
    logits = out["logits"]
    assert len(logits["kl_per_position"]) == n and 0 < logits["mean_kl"] < 1e-6
    compact = clearlm.load(smollm2_path, weights="compact")
    a, b = smollm2.logits(PROMPT), compact.logits(PROMPT)  # (T, V) each
    agree = [bool(x) for x in a.argmax(-1) == b.argmax(-1)]
    assert logits["top1_per_position"] == agree
    assert logits["top1_agreement"] == sum(agree) / n
    assert logits["max_abs_logit"] == (a - b).abs().max().item()
    ppl = out["perplexity"]
    assert abs(ppl["difference"] - (ppl["b"] - ppl["a"])) < 1e-12 and abs(ppl["difference"]) < 1e-3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_different_shapes_are_refused_in_one_line(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf", n_layers=2)
    b = write_tiny_llama(tmp_path / "b.gguf", n_layers=3)
    proc = cli("diff", str(a), str(b), "hello", "-q")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: the models differ in number of blocks (2 vs 3): diff compares two versions of "
        "one model (quantizations, weights, dtypes), not different models"
    ]
    assert proc.stdout == ""


def test_usage_errors_before_any_load():
    """No text, --weights three times, an unknown dtype: exit 2, said before a model is read
    (the names A and B need not exist)."""
    runner = CliRunner()
    cases = {
        ("a", "b"): "give the text to compare on",
        ("a", "b", "x", "--weights", "compact", "--weights", "float32", "--weights", "compact"):
            "give --weights once (both models) or twice (A, then B), not 3 times",
        ("a", "b", "x", "--dtype", "float64"): "'float64' is not one of float32, bfloat16",
        ("a", "b", ""): "the text to compare on is empty",
    }
    for args, needle in cases.items():
        res = runner.invoke(app, ["diff", *args], prog_name="clearlm", env={"COLUMNS": "300"})
        assert res.exit_code == 2 and needle in res.output, res.output


def test_a_plot_path_that_cannot_be_written_is_refused_before_any_load(
    tmp_path, monkeypatch, capsys
):
    """A missing folder, or a folder given as the file: exit 1, one line, before reading A
    (which does not exist here). In this process, through main() as the console script."""
    from clearlm.cli import main

    cases = {
        tmp_path / "nope" / "d.png": f"error: cannot write {tmp_path / 'nope' / 'd.png'}: no such",
        tmp_path: f"error: cannot write {tmp_path}: it is a folder; give a file name such as",
        # a PNG written over a model file (or any file not named .png) is refused
        tmp_path / "model.gguf": "error: --plot writes a PNG: give a file name ending in .png",
    }
    for plot, needle in cases.items():
        monkeypatch.setattr(sys, "argv", ["clearlm", "diff", "a", "b", "x", "--plot", str(plot)])
        with pytest.raises(SystemExit) as e:
            main()
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.startswith(needle), err
        assert len(err.strip().splitlines()) == 1
