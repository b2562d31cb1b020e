"""Hook points come from the module tree: for a tiny model of every family the names equal the
HOOK_POINTS table and each recorded tensor has its documented shape; idle points cost nothing
(the attention pattern is computed only when wanted); the KV cache owns its offset."""

from __future__ import annotations

import pytest
import torch
from hf_tiny import batch_tokens, save_tiny
from test_family_gemma_phi3 import CASES as GEMMA_PHI3
from test_family_gpt2_opt_xglm import CASES as GPT2_OPT_XGLM
from test_family_llama import CASES as LLAMA
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import ClearLMError
from clearlm.generation.loop import new_cache
from clearlm.loading.hf import load_hf_model
from clearlm.model.attention import Attention
from clearlm.model.hooks import AFTER_FORWARD, HOOK_POINTS, hook_name

CASES = {**LLAMA, **GEMMA_PHI3, **GPT2_OPT_XGLM}


# the points of a mixture-of-experts block (model/moe.py; tests/families/test_family_moe.py)
MOE_ONLY = {f"blocks.{{i}}.ffn.{p}" for p in ("router_logits", "expert_ids", "expert_weights")}


def table_names(n_layers: int, additive_positions: bool) -> set[str]:
    """Every name HOOK_POINTS promises a dense model with n_layers blocks inside its forward
    pass."""
    names = set()
    for template in HOOK_POINTS:
        if template in AFTER_FORWARD or (template == "pos" and not additive_positions):
            continue
        if template in MOE_ONLY:
            continue
        names |= {template.replace("{i}", str(i)) for i in range(n_layers)}
    return names


@pytest.mark.parametrize("case", list(CASES))
def test_module_tree_names_equal_the_table_with_documented_shapes(case, tmp_path):
    model_cls, hf_config = CASES[case]
    save_tiny(model_cls, hf_config, tmp_path)
    model = load_hf_model(tmp_path).model
    c = model.config
    assert set(model.hooks.points) == table_names(c.n_layers, c.position != "rope")

    tokens = batch_tokens(length=7)  # (2, 7)
    with model.hooks.recording() as rec, torch.inference_mode():
        logits = model(tokens)
    assert set(rec) == set(model.hooks.points)  # every point fired, under its tree name
    assert torch.equal(rec["logits"], logits)
    B, T = tokens.shape
    letters = dict(B=B, T=T, S=T, D=c.d_model, H=c.n_heads, K=c.n_kv_heads, Hd=c.head_dim)
    letters.update(F=c.d_ff, V=c.vocab_size)
    for name, tensor in rec.items():
        template = name if name in HOOK_POINTS else "blocks.{i}." + name.split(".", 2)[2]
        dims = tuple(letters[x.strip()] for x in HOOK_POINTS[template][0].strip("()").split(","))
        assert tuple(tensor.shape) == dims, (case, name)


def test_module_paths_become_hook_names():
    assert hook_name("layers.3.self_attn.hook_pattern") == "blocks.3.attn.pattern"
    assert hook_name("layers.0.mlp.hook_pre_act") == "blocks.0.ffn.pre_act"
    assert hook_name("layers.11.hook_resid_mid") == "blocks.11.resid_mid"
    assert hook_name("hook_final_norm") == "final_norm"
    with pytest.raises(ValueError, match="must start with 'hook_'"):
        hook_name("layers.0.self_attn.pattern")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("hk") / "t.gguf"))


def test_pattern_is_computed_only_when_a_hook_wants_it(tiny, monkeypatch):
    calls = []
    real = Attention.scores
    monkeypatch.setattr(Attention, "scores", lambda self, *a: calls.append(1) or real(self, *a))
    points = tiny.transformer.hooks.points
    assert not any(p.active for p in points.values())
    trace = tiny.run_with_trace("hello world", names=["blocks.1.attn.z", "logits"])
    assert calls == [] and set(trace) == {"blocks.1.attn.z", "logits"}
    tiny.run_with_trace("hello world", names=["blocks.1.attn.pattern"])
    assert calls == [1]  # block 1 only
    with tiny.hooks({"blocks.0.attn.scores": lambda s, _: None}):
        assert points["blocks.0.attn.scores"].active and not points["blocks.1.attn.q"].active
        tiny.logits("hello world")
    assert calls == [1, 1]
    assert not any(p.active for p in points.values())


def test_points_this_model_lacks_are_refused_by_name(tiny):
    with pytest.raises(ClearLMError, match="no hook point 'pos'.*RoPE"):
        tiny.add_hook("pos", lambda x, _: None)
    with pytest.raises(ClearLMError, match="no hook point 'probs'.*hook 'logits' instead"):
        tiny.add_hook("probs", lambda x, _: None)
    # recording asks for names, not points: 'pos' is valid, simply absent in a RoPE model
    assert set(tiny.run_with_trace("hi", names=["pos", "embed"])) == {"embed"}


def test_cache_offset_moves_only_after_a_whole_pass(tiny):
    """A pass that fails half-way leaves the offset alone; running the token again gives
    the full forward pass's logits."""
    model = tiny.transformer
    ids = torch.tensor([tiny.encode("hello world, hello")])  # (1, T)
    T = ids.shape[1]
    with torch.inference_mode():
        full = model(ids)[0, -1]  # (V,)
        cache = new_cache(model, 1, T)
        model(ids[:, :-1], cache=cache)
        assert cache.offset == T - 1

        def boom(x: torch.Tensor, _: str) -> None:
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"), tiny.hooks({"blocks.1.resid_pre": boom}):
            model(ids[:, -1:], cache=cache)  # block 0 wrote position T − 1, then it failed
        assert cache.offset == T - 1
        last = model(ids[:, -1:], cache=cache)[0, -1]
    assert cache.offset == T
    assert (last - full).abs().max().item() < 1e-5


def test_torch_module_hooks_still_run_on_direct_call_modules() -> None:
    """Blocks, attention, FFNs and norms skip nn.Module.__call__ (DirectCall) only while no
    torch hook is registered: a forward hook, a pre-hook and a global hook still run, and a
    hook's replacement output is what the caller gets."""
    from clearlm.model.hooks import DirectCall
    from clearlm.model.norms import RMSNorm

    norm = RMSNorm(8, 1e-6)
    assert isinstance(norm, DirectCall)
    x = torch.randn(2, 8)
    seen = []
    pre = norm.register_forward_pre_hook(lambda m, args: seen.append("pre"))
    post = norm.register_forward_hook(lambda m, args, out: out * 0)
    assert torch.equal(norm(x), torch.zeros(2, 8)) and seen == ["pre"]
    pre.remove(), post.remove()
    assert torch.equal(norm(x), norm.forward(x))
    glob = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: out + 1)
    try:
        assert torch.equal(norm(x), norm.forward(x) + 1)
    finally:
        glob.remove()


def _shape(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on cpu"


@pytest.mark.parametrize("bad", ["shape", "dtype", "str"])
def test_a_hook_returning_the_wrong_value_is_one_line(tiny, bad):
    """A replacement must be None or a tensor like the input; the message names the point and
    both shapes (they come from the recorded pattern, the reference here)."""
    pattern = tiny.run_with_trace("hello", names=["blocks.1.attn.pattern"])
    x = pattern["blocks.1.attn.pattern"]  # (1, H, T, T): what the hook receives
    ret = {"shape": x[..., :-1], "dtype": x.double(), "str": "oops"}[bad]
    if bad == "str":
        want = f"returned str; return a tensor of the input's shape {tuple(x.shape)}"
    else:
        want = f"returned {_shape(ret)}; expected {_shape(x)}"
    with pytest.raises(ClearLMError) as e, tiny.hooks({"blocks.1.attn.pattern": lambda p, _: ret}):
        tiny.logits("hello")
    assert str(e.value).startswith("hook on blocks.1.attn.pattern " + want), str(e.value)
    assert "\n" not in str(e.value)
    assert not tiny.transformer.hooks.active


def test_hook_signatures_are_checked_when_registered(tiny):
    def lens_style(value, hook):
        return value

    with pytest.raises(ClearLMError, match=r"takes \(tensor, hook\), TransformerLens's signature"):
        tiny.add_hook("blocks.0.resid_pre", lens_style)
    with pytest.raises(ClearLMError, match=r"must take two arguments, fn\(tensor, name\)"):
        tiny.hooks({"blocks.0.resid_pre": lambda x: x}).__enter__()
    with pytest.raises(ClearLMError, match="fwd_hooks calls fn.activation, hook=hook."):
        tiny.run_with_hooks("hi", fwd_hooks=[("blocks.0.resid_pre", lambda x, name: x)])
    assert not tiny.transformer.hooks.active
