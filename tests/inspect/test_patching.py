"""Activation patching (clearlm.inspect.patching, Model.patch): a tiny model with a planted
previous-token copying head, where the answer is known in advance; batching against one run at
a time and against a hook written by hand; the one-line errors; SmolLM2 on a factual recall."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.api.model import Model
from clearlm.config import ModelConfig
from clearlm.errors import ClearLMError
from clearlm.model.transformer import Transformer

CLEAN, CORRUPTED = "wxyz", "wxqz"  # one token a character; they differ at position 2
COPY_GAIN = 5.0  # the planted logit of the copied token


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Model:
    """A random tiny llama (RoPE, 2 blocks) with a byte-level tokenizer."""
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("patch") / "t.gguf"))


def planted(tiny: Model) -> Model:
    """A 2-block model whose block 0 head 0 copies the previous token to the output.

    The residual stream has three parts: token one-hot (dims [0, V)), position one-hot ([V,
    V + C)) and the copied token ([V + C, 2V + C)). Head 0's query at position t is e_t and its
    key at position s is e_{s+1} (scaled up), so it attends to t − 1; its value is the token
    one-hot, which o_proj writes into the copy part; lm_head reads only the copy part. Head 1
    attends uniformly and writes the mean token into the token part (which nothing reads).
    FFNs and block 1 are zero, and there is no final norm: the last position's logits are
    COPY_GAIN × one-hot(the token before it)."""
    V, C = tiny.config.vocab_size, 16
    D = 2 * V + C
    cfg = ModelConfig(
        architecture="planted", vocab_size=V, d_model=D, n_layers=2, n_heads=2, n_kv_heads=2,
        head_dim=V, d_ff=4, norm_eps=1e-9, context_length=C, tie_word_embeddings=False,
        position="learned", ffn="mlp", activation="relu", final_norm=False,
    )  # fmt: skip
    t = Transformer(cfg)
    with torch.no_grad():
        for name, p in t.named_parameters():
            p.copy_(torch.ones_like(p) if "layernorm" in name else torch.zeros_like(p))
        t.embed_tokens.weight[:, :V] = torch.eye(V)
        t.embed_positions.weight[:, V : V + C] = torch.eye(C)
        s = math.sqrt(D / 2)  # RMSNorm scales a token + position input (two ones) by this
        attn = t.layers[0].self_attn
        attn.q_proj.weight[:C, V : V + C] = 2 * torch.eye(C)  # head 0: q = 2s·e_t
        attn.k_proj.weight[1:C, V : V + C - 1] = 2 * torch.eye(C - 1)  # k = 2s·e_{s+1}
        attn.v_proj.weight[:V, :V] = torch.eye(V)  # head 0: v = s·token
        attn.v_proj.weight[V:, :V] = torch.eye(V)  # head 1: the same
        attn.o_proj.weight[V + C :, :V] = torch.eye(V) / s  # head 0 → the copy part
        attn.o_proj.weight[:V, V:] = torch.eye(V) / s  # head 1 → the token part
        t.lm_head.weight[:, V + C :] = COPY_GAIN * torch.eye(V)
    return dataclasses.replace(tiny, transformer=t.eval(), config=cfg)


@pytest.fixture(scope="module")
def circuit(tiny) -> Model:
    return planted(tiny)


def test_the_planted_head_copies_the_previous_token(circuit):
    logits = circuit.logits(CLEAN)[-1]  # (V,)
    y = circuit.encode("y")[0]
    assert int(logits.argmax()) == y
    assert float(logits[y]) == pytest.approx(COPY_GAIN, rel=1e-4)


def test_patching_finds_the_planted_circuit(circuit):
    r = circuit.patch(
        CLEAN, CORRUPTED, ["resid_pre", "blocks.0.attn.out", "ffn.out", "blocks.1.resid_post"],
        answer="y", wrong="q",
    )  # fmt: skip
    assert r.clean_tokens == ["w", "x", "y", "z"] and r.corrupted_tokens[2] == "q"
    assert r.clean_diff == pytest.approx(COPY_GAIN, rel=1e-4)
    assert r.corrupted_diff == pytest.approx(-COPY_GAIN, rel=1e-4)
    rec = dict(zip(r.points, r.recovery, strict=True))  # name → (T,)
    assert r.points[:2] == ["blocks.0.resid_pre", "blocks.1.resid_pre"]
    # Block 0's input at the differing token: the patched run *is* the clean run.
    assert rec["blocks.0.resid_pre"].tolist() == pytest.approx([0, 0, 1, 0], abs=1e-6)
    # The head moved the token to the last position in block 0: from block 1 on, only the
    # last position carries it (the differing position no longer matters).
    assert rec["blocks.0.attn.out"].tolist() == pytest.approx([0, 0, 0, 1], abs=1e-5)
    assert rec["blocks.1.resid_pre"].tolist() == pytest.approx([0, 0, 0, 1], abs=1e-5)
    final = rec["blocks.1.resid_post"]
    assert final.tolist() == pytest.approx([0, 0, 0, 1], abs=1e-6)
    assert float(final.sum()) == pytest.approx(1.0, abs=1e-6)
    # The FFNs are zero in both runs: nothing to recover there.
    assert rec["blocks.0.ffn.out"].abs().max() == 0 and rec["blocks.1.ffn.out"].abs().max() == 0
    # The recovery is the patched logit difference, rescaled.
    span = r.clean_diff - r.corrupted_diff
    assert torch.allclose(r.recovery * span + r.corrupted_diff, r.patched, atol=1e-5)


def test_batched_equals_one_at_a_time_and_a_hook_by_hand(tiny):
    clean, corrupted = "hello world", "hello wormd"  # a random model: any answer pair
    points = ["blocks.0.resid_pre", "blocks.1.attn.out", "blocks.1.attn.z", "blocks.0.attn.q",
              "blocks.1.attn.pattern", "blocks.0.ffn.act", "final_norm", "logits"]  # fmt: skip
    kw = {"answer": "l", "wrong": "d"}
    batched = tiny.patch(clean, corrupted, points, positions=[-3, 5, 7, -1], batch_size=5, **kw)
    single = tiny.patch(clean, corrupted, points, positions=[-3, 5, 7, -1], batch_size=1, **kw)
    assert batched.positions == [6, 5, 7, 8]
    assert torch.allclose(batched.patched, single.patched, rtol=0, atol=1e-5)
    assert torch.allclose(batched.recovery, single.recovery, rtol=0, atol=1e-5)
    # One cell, by hand: the clean block-1 attention output at position 7, written over the
    # corrupted run's with an ordinary hook.
    a, w = tiny.encode("l")[0], tiny.encode("d")[0]
    clean_out = tiny.run_with_trace(clean, ["blocks.1.attn.out"])["blocks.1.attn.out"]

    def put(x, _):
        x = x.clone()
        x[:, 7] = clean_out[:, 7]
        return x

    with tiny.hooks({"blocks.1.attn.out": put}):
        last = tiny.logits(corrupted)[-1]
    assert float(batched.patched[1, 2]) == pytest.approx(float(last[a] - last[w]), abs=1e-5)
    clean_last = tiny.logits(clean)[-1]
    assert batched.clean_diff == pytest.approx(float(clean_last[a] - clean_last[w]), abs=1e-5)
    assert not tiny.transformer.hooks.active  # every patching hook was removed


def test_table_and_dict(circuit):
    r = circuit.patch(CLEAN, CORRUPTED, "blocks.0.resid_pre", answer="y", wrong="q")
    lines = r.table().splitlines()
    assert "clean 5.000, corrupted -5.000" in lines[0]
    assert "2 'y'→'q'" in lines[1] and "3 'z'" in lines[1]
    assert lines[2].split() == ["blocks.0.resid_pre", "0.00", "0.00", "1.00", "0.00"]
    d = r.to_dict()
    assert d["recovery"] == r.recovery.tolist() and d["answer"]["text"] == "y"
    assert d["positions"] == [0, 1, 2, 3] and d["clean_diff"] == r.clean_diff


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        (("hello", "hello world"), {}, "the clean prompt is 3 tokens and the corrupted one 9"),
        (("hello", "hellp"), {"answer": "ab"}, "answer 'ab' is 2 tokens (a|b); give one token"),
        (("hello", "hellp"), {"wrong": 99999}, "wrong token id 99999 is outside the vocabulary"),
        (("hello", "hellp"), {"wrong": "l"}, "answer and wrong are the same token"),
        (("hello", "hellp", "resid_nope"), {}, "hook point 'resid_nope'"),
        (("hello", "hellp", "blocks.7.attn.out"), {}, "hook point 'blocks.7.attn.out'"),
        (("hello", "hellp", "pos"), {}, "hook point 'pos' cannot be patched"),
        (("hello", "hellp", []), {}, "no hook points to patch"),
        (
            ("hello", "hellp", ["resid_pre"] * 2),
            {},
            "'blocks.0.resid_pre' is named more than once ('resid_pre' twice)",
        ),
        (
            ("hello", "hellp", ["resid_pre", "blocks.1.hook_resid_pre"]),
            {},
            "'blocks.1.resid_pre' "
            "is named more than once ('resid_pre' and 'blocks.1.hook_resid_pre')",
        ),
        (("hello", "hellp", "embed", [3]), {}, "position 3 is outside the prompt's 3 tokens"),
        (("hello", "hellp", "embed", []), {}, "no positions to patch; give some of 0 … 2"),
        (("hello", "hellp", "embed", [1.5]), {}, "a position is a whole number, got 1.5"),
        (("hello", "hellp", "embed", "1"), {}, "positions are a list of token positions, got '1'"),
        (("hello", "hellp", "embed", 0), {"batch_size": 0}, "batch_size is a whole number"),
        (("hello", "hellp", "embed", 0), {"batch_size": 2.0}, "at least 1; got 2.0"),
        (("hello", "hellp", "embed", 0), {"batch_size": None}, "at least 1; got None"),
        (("hello", "hellp"), {"answer": "ab"}, "' Paris'), or its id as an int"),
        (("hello", "hello"), {}, "the clean and corrupted prompts give the same logit difference"),
    ],
)
def test_bad_input_is_one_line(tiny, args, kw, message):
    with pytest.raises(ClearLMError) as e:
        tiny.patch(*args, **{"answer": "l", "wrong": "o", **kw})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_positions_and_ids_take_ints_and_integer_scalars(circuit):
    """One position, numpy's and torch's integers: the same grid as plain ints."""
    import numpy as np

    y, q = circuit.encode("y")[0], circuit.encode("q")[0]
    want = circuit.patch(CLEAN, CORRUPTED, "blocks.0.resid_pre", [2], answer=y, wrong=q)
    for positions in (2, np.int64(2), torch.tensor(2), [np.int32(-2)], torch.tensor([2])):
        got = circuit.patch(CLEAN, CORRUPTED, "blocks.0.resid_pre", positions, answer=np.int64(y),
                            wrong=torch.tensor(q), batch_size=np.int64(3))  # fmt: skip
        assert got.positions == [2] and torch.equal(got.recovery, want.recovery), positions
    assert float(want.recovery[0, 0]) == pytest.approx(1.0, abs=1e-5)  # the token that differs


def test_patch_activations_refuses_a_point_named_twice_after_aliases(tiny):
    from clearlm.inspect.patching import patch_activations

    ids = tiny.encode("hello")
    with pytest.raises(ClearLMError, match="'blocks.0.attn.out' is named more than once"):
        patch_activations(tiny.transformer, ids, ids, ["blocks.0.attn.out",
                          "blocks.0.hook_attn_out"], [0], 1, 2)  # fmt: skip
    assert not tiny.transformer.hooks.active


def test_smollm2_factual_recall_moves_from_subject_to_last_position(smollm2):
    """The Eiffel Tower / the Colosseum: the city is read from the subject tokens early, and
    written to the last position late (as Meng et al. 2022 found by causal tracing in GPT-2)."""
    clean, corrupted = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"
    assert len(smollm2.encode(clean)) == len(smollm2.encode(corrupted)) == 9
    blocks = list(range(0, 30, 3))  # every third block: 10 × 9 patched runs
    points = [f"blocks.{i}.resid_pre" for i in blocks]
    r = smollm2.patch(clean, corrupted, points, answer=" Paris", wrong=" Rome")
    assert r.clean_diff > 0 > r.corrupted_diff  # the clean prompt prefers Paris, the other Rome
    rec = r.recovery  # (10, 9)
    pairs = zip(r.clean_tokens, r.corrupted_tokens, strict=True)
    differ = [i for i, (a, b) in enumerate(pairs) if a != b]
    assert differ == [1, 2, 3]  # ' E' 'iffel' ' Tower' / ' Col' 'osse' 'um'
    same = [i for i in range(9) if i not in differ]
    assert rec[0, same].abs().max() < 1e-5  # identical tokens, identical block-0 input
    subject = rec[:, differ].max(dim=1).values  # (10,) the best subject position per block
    last = rec[:, -1]  # (10,)
    # early blocks (0-9): a subject token alone brings back most of the answer; the last none
    assert (subject[:4] > 0.5).all() and (last[:4].abs() < 0.1).all()
    # late blocks (24, 27): the subject no longer matters; the last position brings it back
    assert (subject[-2:].abs() < 0.1).all() and (last[-2:] > 0.5).all()
    # the hand-over happens once, past the middle: after it the last position leads
    moved = int((last > subject).int().argmax())
    assert 12 < blocks[moved] < 28 and (last[moved:] > subject[moved:]).all()
