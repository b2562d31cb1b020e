"""Hook points: traced tensors are the plain forward pass's, hooks can intervene, the logit lens
ends at the model's own distribution."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import ClearLMError
from clearlm.model.hooks import HOOK_POINTS

PROMPT = "The capital of France is"
MOE_ONLY = {"router_logits", "expert_ids", "expert_weights"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("tr") / "t.gguf"))


def test_every_hook_point_is_recorded_with_documented_shape(smollm2):
    trace = smollm2.run_with_trace(PROMPT)
    c = smollm2.config
    T = len(trace.tokens)
    letters = {
        "B": 1,
        "T": T,
        "S": T,
        "D": c.d_model,
        "H": c.n_heads,
        "K": c.n_kv_heads,
        "Hd": c.head_dim,
        "F": c.d_ff,
        "V": c.vocab_size,
    }
    for template, (shape, _) in HOOK_POINTS.items():
        if template == "pos":  # RoPE model: no additive positions
            assert "pos" not in trace
            continue
        if ".ffn." in template and template.split(".")[-1] in MOE_ONLY:
            # mixture-of-experts points (tests/families/test_family_moe.py): a dense block has none
            assert template.replace("{i}", "0") not in trace
            continue
        dims = tuple(letters[x.strip()] for x in shape.strip("()").split(","))
        for i in (0, c.n_layers - 1):
            name = template.replace("{i}", str(i))
            assert tuple(trace[name].shape) == dims, name


def test_traced_tensors_equal_the_plain_forward_pass(smollm2):
    """Bit for bit: tracing (even of attention patterns) does not change the computation."""
    trace = smollm2.run_with_trace(PROMPT)
    plain = smollm2.logits(PROMPT)
    assert torch.equal(trace["logits"][0], plain)
    # The residual stream after block 3, recomputed by running the blocks by hand.
    model = smollm2.transformer
    ids = torch.tensor([trace.tokens])
    positions = torch.arange(ids.shape[1])
    with torch.inference_mode():
        x = model.embed(ids, positions)
        rope = model.rope(positions)
        for layer in model.layers[:4]:
            x = layer(x, rope, positions, None)
    assert torch.equal(trace["blocks.3.resid_post"], x)
    # The pattern the hooks saw is the softmax of the scores, and rows sum to 1 (causal).
    pattern = trace["blocks.2.attn.pattern"][0]  # (H, T, T)
    assert torch.allclose(pattern.sum(-1), torch.ones(pattern.shape[:2]))
    assert torch.all(pattern.triu(1) == 0)
    assert torch.equal(pattern, torch.softmax(trace["blocks.2.attn.scores"][0], -1))


def test_identity_hook_changes_nothing_and_zeroing_a_head_changes_logits(smollm2):
    plain = smollm2.logits(PROMPT)
    handle = smollm2.add_hook("blocks.4.attn.pattern", lambda p, _: p)
    try:
        assert torch.equal(smollm2.logits(PROMPT), plain)  # same tensor back: bit for bit
    finally:
        handle.remove()
    # An equal copy counts as a replacement and is mixed with the values explicitly (not by
    # scaled_dot_product_attention): the same numbers up to float rounding.
    handle = smollm2.add_hook("blocks.4.attn.pattern", lambda p, _: p.clone())
    try:
        assert torch.allclose(smollm2.logits(PROMPT), plain, atol=1e-4)
    finally:
        handle.remove()

    def ablate(z: torch.Tensor, _: str) -> torch.Tensor:
        z = z.clone()
        z[:, :, 2] = 0.0  # (B, T, H, Hd): silence head 2
        return z

    handle = smollm2.add_hook("blocks.4.attn.z", ablate)
    try:
        ablated = smollm2.logits(PROMPT)
        trace = smollm2.run_with_trace(PROMPT, names=["blocks.4.attn.z"])
    finally:
        handle.remove()
    assert (ablated - plain).abs().max() > 1e-3
    assert torch.all(trace["blocks.4.attn.z"][0, :, 2] == 0)
    assert torch.equal(smollm2.logits(PROMPT), plain)  # removed: back to normal
    assert not smollm2.transformer.hooks.active


def test_replacing_the_pattern_is_used(tiny):
    """A uniform causal pattern replaces the real one: logits change; each row still mixes
    values with the weights given."""
    plain = tiny.logits("hello world")

    def uniform(p: torch.Tensor, _: str) -> torch.Tensor:
        T = p.shape[-1]
        w = torch.tril(torch.ones(T, T))
        return (w / w.sum(-1, keepdim=True)).expand_as(p)

    h = tiny.add_hook("blocks.0.attn.pattern", uniform)
    try:
        changed = tiny.logits("hello world")
    finally:
        h.remove()
    assert (changed - plain).abs().max() > 1e-4


def test_logit_lens_ends_at_the_models_distribution(smollm2):
    lens = smollm2.logit_lens(PROMPT)  # (N + 1, V)
    assert lens.shape == (smollm2.config.n_layers + 1, smollm2.config.vocab_size)
    final = smollm2.next_token_distribution(PROMPT)
    assert torch.allclose(lens[-1], final, atol=1e-6)
    assert torch.allclose(lens.sum(-1), torch.ones(lens.shape[0]), atol=1e-4)
    top = smollm2.tokenizer.decode([int(lens[-1].argmax())])
    assert top.strip() == "Paris"


def test_unknown_hook_names_are_refused(tiny):
    with pytest.raises(ClearLMError, match="unknown hook point 'blocks.0.attn.patern'"):
        tiny.add_hook("blocks.0.attn.patern", lambda x, _: None)
    with pytest.raises(ClearLMError, match="unknown hook point 'blocks.9.resid_post'"):
        tiny.run_with_trace("hi", names=["blocks.9.resid_post"])  # tiny has 2 blocks


def test_learned_position_models_expose_pos(tmp_path):
    from hf_tiny import TINY, save_tiny
    from transformers import GPT2Config, GPT2LMHeadModel

    from clearlm.loading.hf import load_hf_model

    cfg = GPT2Config(vocab_size=TINY["vocab_size"], n_embd=64, n_layer=2, n_head=4, n_positions=64)
    save_tiny(GPT2LMHeadModel, cfg, tmp_path)
    loaded = load_hf_model(tmp_path)
    model = loaded.model
    with model.hooks.recording() as rec, torch.inference_mode():
        model(torch.tensor([[5, 6, 7]]))
    assert not model.hooks.active  # the recording ended with the block
    assert rec["pos"].shape == (3, 64)
    assert torch.equal(rec["blocks.0.resid_pre"][0], rec["embed"][0] + rec["pos"])


def test_hooks_context_manager_removes_hooks_on_exit_and_on_error(tiny):
    plain = tiny.logits("hello world")

    def zero_head_1(z: torch.Tensor, _: str) -> torch.Tensor:
        z = z.clone()
        z[:, :, 1] = 0.0  # (B, T, H, Hd)
        return z

    with tiny.hooks({"blocks.1.attn.z": zero_head_1}) as m:
        assert m is tiny
        ablated = tiny.logits("hello world")
        assert tiny.transformer.hooks.active
    assert (ablated - plain).abs().max() > 1e-4
    assert not tiny.transformer.hooks.active
    with pytest.raises(RuntimeError, match="boom"), tiny.hooks({"blocks.0.attn.z": zero_head_1}):
        raise RuntimeError("boom")
    assert not tiny.transformer.hooks.active
    assert torch.equal(tiny.logits("hello world"), plain)
    # one bad name: nothing is added at all
    with pytest.raises(ClearLMError, match="unknown hook point"):
        with tiny.hooks({"blocks.0.attn.z": zero_head_1, "blocks.0.nope": zero_head_1}):
            pass
    assert not tiny.transformer.hooks.active


def _pieces_to_bytes(pieces: list[str]) -> bytes:
    """Undo the <0xNN> spelling: the bytes the pieces stand for."""
    import re

    out = b""
    for p in pieces:
        for part in re.split(r"(<0x[0-9A-F]{2}>)", p):
            m = re.fullmatch(r"<0x([0-9A-F]{2})>", part)
            out += bytes([int(m.group(1), 16)]) if m else part.encode("utf-8")
    return out


def test_to_str_tokens_shows_partial_characters_as_bytes(tiny):
    # The tiny vocabulary has one token per byte: "日本" is six byte tokens, none a character.
    text = "日本 he"
    pieces = tiny.to_str_tokens(text)
    expected_bytes = [f"<0x{b:02X}>" for b in "日本".encode()]
    assert pieces == expected_bytes + [" ", "he"]
    assert "�" not in "".join(pieces)
    assert tiny.run_with_trace(text, names=["embed"]).text == pieces


def test_to_str_tokens_round_trips_the_text_on_smollm2(smollm2, hf_smollm2_tokenizer):
    text = "The café in 東京 serves 🍣."
    pieces = smollm2.to_str_tokens(text)
    ids = hf_smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(pieces) == len(ids)  # one piece per reference token
    assert _pieces_to_bytes(pieces) == text.encode()
    assert "�" not in "".join(pieces)
    assert " café" in pieces or " caf" in pieces  # whole characters stay text
