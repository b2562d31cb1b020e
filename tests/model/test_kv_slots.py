"""The slot KV cache and per-row positions: rows at different lengths decode in one batch, each
giving the logits of its own sequence run alone without a cache; padding rows (position −1)
produce no NaN in float32, bfloat16 or float16 and change nothing; reading the filled prefix
(n_keys) equals reading the whole buffer."""

from __future__ import annotations

import pytest
import torch
from hf_tiny import save_tiny
from test_family_gemma_phi3 import CASES as GEMMA_PHI3
from test_family_gpt2_opt_xglm import CASES as GPT2_OPT_XGLM
from tiny_gguf import write_tiny_llama

from clearlm.generation.loop import new_cache
from clearlm.loading.checkpoint import load_gguf_model
from clearlm.loading.hf import load_hf_model
from clearlm.model.attention import attention_mask

# learned and sinusoidal positions, soft-capped scores with a sliding window, Gemma 3's local RoPE
HF_CASES = {
    "gpt2": GPT2_OPT_XGLM["gpt2"],
    "xglm": GPT2_OPT_XGLM["xglm"],
    "gemma2-softcap": GEMMA_PHI3["gemma2-softcap"],
    "gemma3": GEMMA_PHI3["gemma3"],
}
LENGTHS = (5, 9, 12)  # prompt lengths of the three rows
STEPS = 6  # decode steps (teacher-forced tokens), past the sliding window of 4


@pytest.fixture(scope="module", params=["llama-gguf", *HF_CASES])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    if request.param == "llama-gguf":
        return write_tiny_llama(path / "t.gguf")
    model_cls, config = HF_CASES[request.param]
    save_tiny(model_cls, config, path)
    return path


def load(folder, dtype=torch.float32):
    if str(folder).endswith(".gguf"):
        return load_gguf_model(folder, dtype).model
    return load_hf_model(folder, dtype).model


def sequences(vocab: int) -> list[list[int]]:
    """Three sequences (prompt + STEPS continuation tokens) of different lengths."""
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, vocab, (n + STEPS,), generator=g).tolist() for n in LENGTHS]


def batched_logits(model, seqs, cache, pad_row: int | None = None, n_keys=None) -> torch.Tensor:
    """Prefill each prompt into its own slot (row i → slot i, or i + 1 past a padding slot),
    then decode STEPS tokens for all rows together; returns the decode logits (B, STEPS, V)."""
    slots = [i if pad_row is None or i < pad_row else i + 1 for i in range(len(seqs))]
    with torch.inference_mode():
        for seq, slot in zip(seqs, slots, strict=True):
            model(torch.tensor([seq[:-STEPS]]), cache=cache, slot=slot)
        out = []
        for step in range(STEPS):
            n_rows = cache.n_slots
            tokens = torch.zeros(n_rows, 1, dtype=torch.long)
            positions = torch.full((n_rows, 1), -1)  # free slots: padding
            for seq, slot in zip(seqs, slots, strict=True):
                at = len(seq) - STEPS + step
                tokens[slot, 0], positions[slot, 0] = seq[at], at
            keys = None if n_keys is None else max(len(s) for s in seqs) - STEPS + step + 1
            logits = model(tokens, positions, cache=cache, n_keys=keys)  # (n_slots, 1, V)
            out.append(logits[slots, 0])
    return torch.stack(out, dim=1)  # (B, STEPS, V)


def alone_logits(model, seqs) -> list[torch.Tensor]:
    """Each sequence alone, no cache: the logits at its last STEPS positions."""
    with torch.inference_mode():
        return [model(torch.tensor([s]))[0, -STEPS:] for s in seqs]


def test_rows_at_different_lengths_equal_each_run_alone(folder):
    model = load(folder)
    seqs = sequences(model.config.vocab_size)
    cache = new_cache(model, len(seqs), max(len(s) for s in seqs))
    got = batched_logits(model, seqs, cache)
    for row, ref in enumerate(alone_logits(model, seqs)):
        assert (got[row] - ref).abs().max().item() < 1e-4, row
    assert cache.lengths.tolist() == [len(s) for s in seqs]


def test_reading_the_filled_prefix_equals_reading_the_whole_buffer(folder):
    model = load(folder)
    seqs = sequences(model.config.vocab_size)
    whole = batched_logits(model, seqs, new_cache(model, len(seqs), 40))
    prefix = batched_logits(model, seqs, new_cache(model, len(seqs), 40), n_keys=True)
    assert (whole - prefix).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_padding_row_gives_no_nan_and_changes_nothing(folder, dtype):
    """A free slot in the middle of the decode batch (position −1): no NaN anywhere, the other
    rows equal the batch without it, and the free slot stays empty."""
    model = load(folder, dtype)
    seqs = sequences(model.config.vocab_size)
    S = max(len(s) for s in seqs)
    plain = batched_logits(model, seqs, new_cache(model, len(seqs), S))
    cache = new_cache(model, len(seqs) + 1, S)
    padded = batched_logits(model, seqs, cache, pad_row=1)
    assert not padded.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 0.1
    assert (padded.float() - plain.float()).abs().max().item() <= tol
    assert cache.lengths[1].item() == 0
    with torch.inference_mode():  # every row padding: the logits are finite all the same
        pad = model(torch.zeros(2, 3, dtype=torch.long), torch.full((2, 3), -1), cache=cache)
    assert torch.isfinite(pad).all()


def test_a_query_that_sees_no_key_sees_every_key_instead():
    """Padding queries (position −1) would be fully masked, and softmax over nothing is NaN;
    they see every key instead (their output is discarded). Real rows keep the causal mask."""
    positions = torch.tensor([[0, 1, 2], [-1, 0, 1]])  # row 1: one padding token first
    mask = attention_mask(positions, positions)  # (B, T, S)
    causal = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask[0], causal)
    assert mask[1, 0].all()  # the padding query
    assert torch.equal(mask[1, 1:], torch.tensor([[0, 1, 0], [0, 1, 1]], dtype=torch.bool))
    windowed = attention_mask(torch.tensor([5]), 8, window=3)  # keys 3, 4, 5
    assert windowed.tolist() == [[False] * 3 + [True] * 3 + [False] * 2]


def test_cached_step_traces_into_one_graph(tmp_path):
    """No host synchronisation in a cached forward pass: torch.compile's tracer captures the
    one-token decode step (per-row positions, and the default ones from the slot lengths) and
    a prefill chunk as single graphs, with no graph break (a `.item()`, `int(tensor)` or a
    branch on a value would break it)."""
    import torch._dynamo as dynamo

    model = load(write_tiny_llama(tmp_path / "t.gguf"))
    cache = new_cache(model, 2, 32)
    with torch.inference_mode():
        model(torch.tensor([[5, 6, 7]]), cache=cache, slot=0)
        model(torch.tensor([[5, 6]]), cache=cache, slot=1)
        calls = [
            lambda: model(torch.tensor([[8], [9]]), torch.tensor([[3], [2]]), cache=cache),
            lambda: model(torch.tensor([[8], [9]]), cache=cache, last_only=True),
            lambda: model(torch.tensor([[4, 5]]), cache=cache, slot=1, n_keys=8),
        ]
        for call in calls:
            report = dynamo.explain(call)()
            assert (report.graph_count, report.graph_break_count) == (1, 0), report.break_reasons
