"""Perplexity against transformers' own loss on a tiny model, and on SmolLM2."""

from __future__ import annotations

import math

import pytest
import torch
from cli_in_process import run_clearlm
from hf_tiny import TINY, batch_tokens, save_tiny
from tiny_gguf import write_tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

from clearlm.errors import ClearLMError, SamplingParamsError
from clearlm.generation.perplexity import perplexity, windows
from clearlm.loading.hf import load_hf_model


def reference_nll(hf_model, ids: torch.Tensor, context: int, stride: int) -> tuple[float, int]:
    """The sliding-window loop of transformers' perplexity guide: labels −100 on the context
    part; the loss is a mean over the scored (shifted) labels, so × their count gives the sum."""
    nll, count, prev_end = 0.0, 0, 0
    n = ids.shape[1]
    for begin in range(0, n, stride):
        end = min(begin + context, n)
        trg_len = end - prev_end
        x = ids[:, begin:end]
        labels = x.clone()
        labels[:, :-trg_len] = -100
        with torch.inference_mode():
            loss = hf_model(x, labels=labels).loss
        scored = int((labels[:, 1:] != -100).sum())
        nll += loss.item() * scored
        count += scored
        prev_end = end
        if end == n:
            break
    return nll, count


@pytest.mark.parametrize("context,stride", [(64, 64), (32, 16), (20, 7)])
def test_perplexity_equals_transformers_loss(tmp_path, context, stride):
    hf_model = save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), tmp_path)
    ours = load_hf_model(tmp_path).model
    ids = batch_tokens(seed=5, batch=1, length=90)
    ref_nll, ref_count = reference_nll(hf_model, ids, context, stride)
    got = perplexity(ours, ids[0].tolist(), context=context, stride=stride)
    assert got.n_predicted == ref_count
    if stride < context:  # overlapping windows: every token but the first, exactly once
        assert got.n_predicted == 89
    assert got.nll == pytest.approx(ref_nll, rel=1e-5)
    assert got.perplexity == pytest.approx(math.exp(ref_nll / ref_count), rel=1e-5)


def test_windows_score_each_token_once():
    spans = windows(100, 30, 11)
    scored = [t for _, end, first in spans for t in range(first, end)]
    assert scored == list(range(1, 100))


def test_bad_arguments(tmp_path):
    save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), tmp_path)
    ours = load_hf_model(tmp_path).model
    with pytest.raises(ClearLMError, match="stride"):
        perplexity(ours, list(range(10)), context=8, stride=9)
    with pytest.raises(ClearLMError, match="exceeds"):
        perplexity(ours, list(range(10)), context=1000)
    with pytest.raises(ClearLMError, match="fewer than 2"):
        perplexity(ours, [5])


@pytest.mark.parametrize(
    ("context", "stride", "option"),
    [
        (1, None, "--context"),
        (0, None, "--context"),
        (-5, None, "--context"),
        (2.5, None, "--context"),
        (True, None, "--context"),
        (None, 0, "--stride"),
        (None, -1, "--stride"),
        (8, 9, "--stride"),
    ],
)
def test_window_options_out_of_range(tmp_path, context, stride, option):
    """context 1 was a ZeroDivisionError; 0 silently meant the default; -5 blamed --stride."""
    save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), tmp_path)
    ours = load_hf_model(tmp_path).model
    with pytest.raises(SamplingParamsError) as e:
        perplexity(ours, list(range(10)), context=context, stride=stride)
    assert str(e.value).startswith(option), str(e.value)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--context", "1"], "--context"),
        (["--context", "-5"], "--context"),
        (["--context", "0"], "--context"),
        (["--stride", "0"], "--stride"),
    ],
)
def test_cli_window_options_are_usage_errors(tmp_path, args, option):
    text = tmp_path / "t.txt"
    text.write_text("hello hello hello")
    model = write_tiny_llama(tmp_path / "m.gguf")
    # clearlm.cli.main, in this process (a subprocess spends ~2.5 s importing torch)
    proc = run_clearlm("perplexity", str(text), "-m", str(model), *args, text=True)
    err = proc.stderr.strip()
    assert proc.returncode == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error:") and option in err, err


def test_smollm2_perplexity_on_alice(smollm2, alice_text):
    """The figure docs/models.md reports: SmolLM2-135M on the opening of Alice (548 tokens)."""
    ids = smollm2.encode(alice_text)
    res = perplexity(smollm2.transformer, ids, context=256, stride=128)
    print(
        f"\nSmolLM2-135M-Instruct perplexity on alice.txt: {res.perplexity:.3f} "
        f"({res.n_predicted} tokens, context 256, stride 128)"
    )
    assert res.n_predicted == len(ids) - 1
    assert 2.0 < res.perplexity < 40.0  # a fluent English text under a small instruct model
