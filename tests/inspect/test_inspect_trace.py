"""The trace is the single source of the views: Trace.logit_lens / probs / pattern computed from
one forward pass equal the same quantities computed independently, and the ui's analysis runs
exactly one forward pass for a prompt."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.inspect.analysis import analyze
from clearlm.inspect.trace import Trace, lens_names, pattern_names

PROMPT = "hello world hello"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("it") / "t.gguf"))


def by_hand_lens(model, resid: torch.Tensor) -> torch.Tensor:
    """(R, D) residual rows → final RMSNorm → lm_head → softmax, written out: (R, V) float32."""
    t = model.transformer
    x = resid.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model.config.norm_eps) * t.norm.weight
    return torch.softmax(t.lm_head(x).float(), dim=-1)


def test_logit_lens_at_every_position_equals_the_formula(tiny):
    n = tiny.config.n_layers
    trace = tiny.run_with_trace(PROMPT, lens_names(n))
    lens = trace.logit_lens()  # (N + 1, T, V)
    T = len(trace.tokens)
    assert lens.shape == (n + 1, T, tiny.config.vocab_size)
    # RoPE model: what block 0 receives is the embedding itself
    embed = tiny.run_with_trace(PROMPT, ["embed"])["embed"]
    assert torch.equal(trace["blocks.0.resid_pre"], embed)
    rows = [trace["blocks.0.resid_pre"][0]] + [trace[f"blocks.{i}.resid_post"][0] for i in range(n)]
    for r, resid in enumerate(rows):
        assert torch.allclose(lens[r], by_hand_lens(tiny, resid), atol=1e-6)
    # one position equals the same row of every position; the public method reads the same
    for pos in (0, -1):
        assert torch.allclose(trace.logit_lens(pos), lens[:, pos], atol=1e-6)
    assert torch.equal(tiny.logit_lens(PROMPT), trace.logit_lens(-1))
    assert torch.allclose(lens[-1], tiny.run_with_trace(PROMPT, ["logits"]).probs, atol=1e-6)


def test_probs_and_patterns(tiny):
    n = tiny.config.n_layers
    full = tiny.run_with_trace(PROMPT)  # records "probs" too
    part = tiny.run_with_trace(PROMPT, ["logits", *pattern_names(n)])  # probs from the logits
    expected = torch.softmax(tiny.logits(PROMPT).float(), dim=-1)  # (T, V)
    assert torch.allclose(full.probs, expected, atol=1e-6)
    assert torch.equal(part.probs, full.probs)
    for i in range(n):
        assert torch.equal(part.pattern(i), full[f"blocks.{i}.attn.pattern"][0].float())
    stacked = part.patterns()  # (N, H, T, T)
    assert stacked.shape[:2] == (n, tiny.config.n_heads)
    assert torch.equal(stacked[-1], part.pattern(n - 1))


def test_a_trace_without_unembed_or_streams_says_so():
    trace = Trace({"logits": torch.zeros(1, 2, 3)}, [1, 2], ["a", "b"])
    with pytest.raises(ValueError, match="no unembed"):
        trace.logit_lens()
    with pytest.raises(KeyError, match="was not recorded"):
        Trace({}, [1], ["a"], unembed=lambda x: x).logit_lens()


def test_analyze_runs_one_forward_pass(tiny, monkeypatch):
    calls = []
    forward = type(tiny.transformer).forward

    def counting(self, *args, **kwargs):
        calls.append(args[0].shape)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(tiny.transformer), "forward", counting)
    a = analyze(tiny, PROMPT)
    assert len(calls) == 1
    monkeypatch.undo()
    assert torch.equal(a.lens, tiny.logit_lens(PROMPT))
    assert torch.equal(a.distribution, tiny.run_with_trace(PROMPT, ["logits"]).probs[-1])
    assert torch.equal(a.last_logits, tiny.logits(PROMPT)[-1].float())
