"""clearlm.diff: two versions of one model compared hook point by hook point (issue 37, item 1).

References: a model against itself (exactly 0 everywhere), a model with one block's FFN output
scaled by 1.5 (found at exactly that block, with the scaled output's relative error |1.5 − 1|),
torch's own KL divergence and cross-entropy for the logit statistics and perplexities.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.cli.diff import DEFAULT_THRESHOLD as CLI_THRESHOLD
from clearlm.inspect.diff import (
    BLOCK_POINTS,
    DEFAULT_THRESHOLD,
    ModelsDifferError,
    NonFiniteError,
    check_comparable,
    relative_error,
)
from clearlm.inspect.diff_plot import diff_png

TEXT = "hello world, hello there: a small text"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-block tiny model (float32 weights)."""
    return write_tiny_llama(tmp_path_factory.mktemp("diff") / "tiny.gguf", n_layers=4, seed=3)


def test_a_model_against_itself_diffs_to_zero(tiny):
    a, b = clearlm.load(tiny), clearlm.load(tiny)  # two loads: not one object compared with itself
    d = clearlm.diff(a, b, TEXT)
    assert d.blocks.shape == (4, len(BLOCK_POINTS), len(a.encode(TEXT)))
    for err in (d.blocks, d.embed, d.final_norm, d.kl):
        assert torch.count_nonzero(err) == 0
    assert bool(d.top1.all()) and d.logits.top1_agreement == 1.0
    assert d.logits.max_abs_logit == 0.0 and d.logits.mean_kl == 0.0
    assert d.first_layer is None
    assert d.perplexity_a == d.perplexity_b
    by_path = clearlm.diff(str(tiny), tiny, TEXT, dtype=("float32", "float32"))  # loaded here
    assert torch.equal(by_path.blocks, d.blocks) and by_path.tokens == d.tokens


def test_one_scaled_block_is_found_at_that_block(tiny):
    a, b = clearlm.load(tiny), clearlm.load(tiny)
    with torch.no_grad():
        b.transformer.layers[2].mlp.down_proj.weight.mul_(1.5)
    d = clearlm.diff(a, b, TEXT)
    assert d.first_layer == 2
    assert torch.count_nonzero(d.blocks[:2]) == 0 and torch.count_nonzero(d.embed) == 0
    # block 2: attention ran on the same input; its FFN output is 1.5 times A's: ‖a − 1.5a‖/‖a‖
    at = dict(zip(BLOCK_POINTS, d.blocks[2], strict=True))
    assert torch.count_nonzero(at["attn.out"]) == 0 and torch.count_nonzero(at["resid_mid"]) == 0
    torch.testing.assert_close(at["ffn.out"], torch.full_like(at["ffn.out"], 0.5), rtol=1e-5,
                               atol=0)
    assert bool((at["resid_post"] > 0).all()) and bool((d.blocks[3] > 0).all())

    # the logit statistics against torch's own KL and cross-entropy on the two models' logits
    ids = a.encode(TEXT)
    la, lb = a.logits(ids).double(), b.logits(ids).double()  # (T, V)
    kl = F.kl_div(lb.log_softmax(-1), la.log_softmax(-1), log_target=True,
                  reduction="none").sum(-1)
    torch.testing.assert_close(d.kl, kl, rtol=1e-9, atol=1e-15)
    agree = (la.argmax(-1) == lb.argmax(-1)).double().mean().item()
    assert d.logits.top1_agreement == agree < 1.0
    target = torch.tensor(ids[1:])
    for got, logits in ((d.perplexity_a, la), (d.perplexity_b, lb)):
        assert got == pytest.approx(math.exp(F.cross_entropy(logits[:-1], target).item()),
                                    rel=1e-12)
    assert d.perplexity_a != d.perplexity_b

    # --json's numbers are the same ones
    out = d.to_dict()
    assert out["first_layer"] == 2 and out["points"] == list(BLOCK_POINTS)
    assert out["layers"][2]["ffn.out"]["max"] == pytest.approx(0.5, rel=1e-5)
    assert out["layers"][1]["resid_post"] == {"max": 0.0, "mean": 0.0,
                                              "per_position": [0.0] * len(ids)}
    assert out["logits"]["top1_agreement"] == agree
    # the picture draws the residual stream's errors (block × position)
    png, grid = diff_png(d)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (grid == d.point("resid_post").numpy()).all()


def test_a_model_with_nan_weights_is_refused_not_reported_as_equal(tiny):
    """A NaN passes every max and threshold silently (max KL 0, first layer none): refused."""
    a, b = clearlm.load(tiny), clearlm.load(tiny)
    with torch.no_grad():
        b.transformer.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="model B's logits contain NaN or inf at position 0"):
        clearlm.diff(a, b, TEXT)


def test_threshold_moves_the_first_layer(tiny):
    """Every block differs a little at another dtype; the threshold decides which is first."""
    a, b = clearlm.load(tiny), clearlm.load(tiny, dtype="bfloat16")
    d = clearlm.diff(a, b, TEXT, threshold=0.0)
    assert d.first_layer == 0 and bool((d.blocks > 0).any())
    worst = d.point("resid_post").amax(1)  # (N,)
    high = dataclasses.replace(d, threshold=float(worst.max()))
    assert high.first_layer is None  # over, not equal


def test_relative_error_by_hand():
    a = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])  # (T=4, D=2)
    b = torch.tensor([[3.0, 4.5], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    got = relative_error(a, b)
    assert got.dtype == torch.float64
    assert got.tolist() == [0.5 / 5.0, 0.0, math.inf, 0.0]


def test_pairs_that_cannot_be_compared_are_refused(tiny):
    c = clearlm.load(tiny).config
    ids = [1, 2, 3]
    check_comparable(c, c, ids, ids)  # the same: accepted

    def other(**changed: int) -> SimpleNamespace:  # the sizes check_comparable reads
        sizes = ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff")
        return SimpleNamespace(**{**{k: getattr(c, k) for k in sizes}, **changed})

    cases = {
        "vocabulary size (262 vs 300)": (other(vocab_size=300), ids),
        "number of blocks (4 vs 3)": (other(n_layers=3), ids),
        "d_model (64 vs 32)": (other(d_model=32), ids),
        f"n_heads ({c.n_heads} vs 8)": (other(n_heads=8), ids),
        f"n_kv_heads ({c.n_kv_heads} vs 1)": (other(n_kv_heads=1), ids),
        f"head_dim ({c.head_dim} vs 8)": (other(head_dim=8), ids),
        f"d_ff ({c.d_ff} vs 4)": (other(d_ff=4), ids),
        "token 1: 2 vs 9": (c, [1, 9, 3]),
        "token 3: end vs 4": (c, [1, 2, 3, 4]),
    }
    for needle, (config, other_ids) in cases.items():
        with pytest.raises(ModelsDifferError) as e:
            check_comparable(c, config, ids, other_ids)
        assert needle in str(e.value) and "\n" not in str(e.value)
        assert e.value.exit_code == 2


def test_the_cli_default_threshold_is_the_library_one():
    assert CLI_THRESHOLD == DEFAULT_THRESHOLD
