"""The CLI on a tiny model: info, generate and chat print what they promise."""

from __future__ import annotations

import subprocess

import pytest
from cli_in_process import run_clearlm
from tiny_gguf import write_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("cli") / "tiny.gguf", context_length=48)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (a subprocess spends
    ~2.5 s importing torch; what is checked here is what a command prints and returns)."""
    return run_clearlm(*args, text=True)


def test_info_lists_hyper_parameters_and_tensor_types(tiny):
    proc = cli("info", str(tiny))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("n_layers", "d_model", "64", "context_length", "48", "n_kv_heads"):
        assert needle in out
    for stage in (
        "1 input representation",
        "2 multi-head self-attention",
        "3 residual + norm + FFN",
        "4 output projection",
    ):
        assert stage in out
    assert "blk.*.attn_q.weight" in out and "F32" in out
    assert "gpt2 (pre-tokenizer smollm)" in out


def test_generate_streams_text_and_prints_counts(tiny):
    proc = cli("generate", "hello", "--model", str(tiny), "-n", "6", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert "prompt 3 tokens" in proc.stderr  # the tiny vocabulary merges: he · ll · o
    assert "generated" in proc.stderr and "tok/s" in proc.stderr


def test_chat_applies_template(tiny):
    proc = cli("chat", "hi", "--model", str(tiny), "-n", "3")
    assert proc.returncode == 0, proc.stderr
    assert "finish:" in proc.stderr


def test_perplexity_command(tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello hello hello world, this is a small text to score.\n")
    proc = cli("perplexity", str(text), "--model", str(tiny), "--context", "16", "--stride", "8")
    assert proc.returncode == 0, proc.stderr
    value = float(proc.stdout.split()[-1])
    import clearlm
    from clearlm.generation.perplexity import perplexity

    m = clearlm.load(tiny)
    expected = perplexity(m.transformer, m.tokenizer.encode(text.read_text()), 16, 8)
    assert abs(value - expected.perplexity) < 1e-3 * expected.perplexity


def test_perplexity_bad_file(tiny):
    proc = cli("perplexity", "/no/such.txt", "--model", str(tiny))
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == ["error: text file not found: /no/such.txt"]


def test_perplexity_one_window_is_singular(tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world")  # fewer tokens than --context: one window
    proc = cli("perplexity", str(text), "--model", str(tiny), "--context", "16", "--stride", "8")
    assert proc.returncode == 0, proc.stderr
    assert " in 1 window · " in proc.stderr
