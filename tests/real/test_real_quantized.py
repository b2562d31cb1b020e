"""llama-quantize's copies of the shipped models (Q2_K, Q3_K_M, Q5_K_M, IQ4_NL, IQ4_XS, IQ3_M,
TQ2_0, and Q2_K / Q3_K / IQ3_XXS / IQ2_XXS / IQ2_XS / IQ2_M / IQ1_S / IQ1_M with ``--pure``,
written by ``make quantize-models`` into ~/.cache/clearlm/quantized/) against transformers
loading the same file in float32 (it dequantizes every tensor through ``gguf.quants``).

For each copy, clearlm's default (compact) load must give:
- logits within 1e-3 of the reference (max |Δ| over every position of a short prompt);
- the same 16-token greedy continuation (or a divergence at a reference near-tie ≤ 1e-3);
- weights in memory (``Model.weight_bytes``) ≤ 1.15 × the file's tensor bytes, the tensors of
  the lattice i-quants and TQ excepted: those are held as int8 codes + float32 scales
  (quant/lattice.py), exactly 1 + 4 / block bytes a value.

Marked ``large`` (each reference load takes 40-80 s and about 3 GB): it runs under ``make
test-large`` (CLEARLM_TEST_LARGE=1, ``-m large``) and skips, naming the command, where a copy has
not been made. The measured figures are printed (``-s``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from real_parity import TOL, greedy_matches_or_near_tie, hf_gguf_model, last_logit_diff

# llama.cpp's mixes, and two copies with every matrix whose rows allow it in Q2_K / Q3_K
# (`llama-quantize --pure`): the mixes hold no Q2_K or Q3_K blocks on these models
FORMATS = ["Q2_K", "Q3_K_M", "Q5_K_M", "IQ4_NL", "IQ4_XS", "IQ3_M", "TQ2_0", "Q2_K-pure",
           "Q3_K-pure", "IQ3_XXS-pure", "IQ2_XXS-pure", "IQ2_XS-pure", "IQ2_M-pure", "IQ1_S-pure",
           "IQ1_M-pure"]
SOURCES = ["qwen2.5-coder-0.5b-instruct-q4_k_m", "SmolLM2-135M-Instruct.Q4_1"]  # file stems
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
N_GREEDY = 16
MEMORY_BOUND = 1.15

pytestmark = [
    pytest.mark.large,
    pytest.mark.skipif(os.environ.get("CLEARLM_TEST_LARGE") != "1",
                       reason="quantized-copy parity: run `make quantize-models`, then "
                       "`make test-large` (sets CLEARLM_TEST_LARGE=1)"),
]


def copy_path(stem: str, fmt: str) -> Path:
    """bench/quantize_models.py's name for a copy: $CLEARLM_CACHE/quantized/<stem>.<FMT>.gguf."""
    base = os.environ.get("CLEARLM_CACHE") or str(Path.home() / ".cache" / "clearlm")
    return Path(base) / "quantized" / f"{stem}.{fmt}.gguf"


@pytest.fixture(scope="module", params=[(s, f) for s in SOURCES for f in FORMATS],
                ids=lambda p: f"{p[0].split('-')[0].split('.')[0]}-{p[1]}")
def pair(request):
    """(clearlm's default load, transformers' float32 model, the file) for one copy."""
    import clearlm

    path = copy_path(*request.param)
    if not path.is_file():
        pytest.skip(f"{path} not made: run `make quantize-models` (builds llama-quantize)")
    return clearlm.load(path), hf_gguf_model(path), path


def test_logits_match_transformers(pair):
    ours, ref, path = pair
    ids = ours.encode(PROMPT)
    last, every = last_logit_diff(ours.transformer, ref, ids)
    print(f"\n{path.name}: {ours.weights}, T={len(ids)} max|Δlogit| last={last:.2e} "
          f"all={every:.2e}")
    assert every <= TOL


def test_greedy_matches_transformers(pair):
    ours, ref, path = pair
    ids = ours.encode(PROMPT)
    got = ours.generate(ids, max_new_tokens=N_GREEDY, temperature=0).tokens
    at, gap = greedy_matches_or_near_tie(got, ref, ids, ours.tokenizer.eos_id)
    print(f"\n{path.name}: greedy {'same' if at is None else f'diverged at {at}'}: "
          f"{ours.tokenizer.decode(got)!r}")
    if at is not None:
        assert gap <= 1e-3, f"diverged at step {at} without a near-tie ({gap})"


def test_weights_in_memory_within_bound_of_file(pair):
    from clearlm.loading.checkpoint import open_checkpoint
    from clearlm.quant.lattice import BLOCK

    ours, _, path = pair
    ckpt = open_checkpoint(path)
    file_bytes = sum(t.n_bytes for t in ckpt.reader.tensors)
    ratio = ours.weight_bytes / file_bytes
    print(f"\n{path.name}: weights {ours.weight_bytes / 1e6:.1f} MB in memory, "
          f"file tensors {file_bytes / 1e6:.1f} MB: {ratio:.3f}×")
    held = ckpt.weight_formats("compact")  # (type name, how and how much) pairs
    assert sum(use.held_bytes for _, use in held) == ours.weight_bytes
    lattice = [t for t in ckpt.reader.tensors if t.tensor_type in BLOCK]
    wide = sum(use.held_bytes for q, use in held if q in {b.name for b in BLOCK})
    n = {q: sum(t.n_elements for t in lattice if t.tensor_type == q) for q in BLOCK}
    assert wide == sum(v + 4 * v // BLOCK[q] for q, v in n.items())  # int8 codes, scales
    rest_file = file_bytes - sum(t.n_bytes for t in lattice)
    assert (ours.weight_bytes - wide) / rest_file <= MEMORY_BOUND
