"""TransformerLens's vocabulary on clearlm models: run_with_cache's tensors are clearlm's own
recording in TransformerLens's layouts (checked against the trace and against attention
recomputed from the cached queries and keys), TransformerLens-named hooks intervene exactly as
clearlm-named ones, unknown names suggest the nearest, and a TransformerLens-style notebook
snippet runs with clearlm.load in place of HookedTransformer.from_pretrained."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.api.model import Model
from clearlm.config import ModelConfig
from clearlm.errors import ClearLMError
from clearlm.inspect.lens_vocab import get_act_name
from clearlm.model.hook_aliases import LENS_NAMES, lens_names_of, unavailable
from clearlm.model.transformer import Transformer

PROMPT = "hello world hello"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """RoPE, grouped-query attention (4 heads, 2 kv heads), gated FFN, RMSNorm: 2 blocks."""
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("lv") / "t.gguf"))


@pytest.fixture(scope="module")
def gpt2(tiny):
    """A GPT-2-shaped model (learned positions, no RoPE, LayerNorm, GELU MLP), randomly
    initialised, with the tiny model's byte tokenizer (its 262 ids fit the 320 rows)."""
    config = ModelConfig(
        architecture="gpt2", vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4,
        head_dim=16, d_ff=128, norm_eps=1e-5, context_length=64, tie_word_embeddings=True,
        position="learned", norm="layer", ffn="mlp", activation="gelu_tanh",
    )
    torch.manual_seed(0)
    transformer = Transformer(config).eval()
    return Model(transformer, tiny.tokenizer, config, {}, {}, "gpt2-shaped")


def attention_from(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale + causal mask) from TransformerLens-layout q [1, T, H, Hd] and k
    [1, T, K, Hd] (each kv head repeated for its H/K query heads): [1, H, T, T]."""
    H, K = q.shape[2], k.shape[2]
    k = k.repeat_interleave(H // K, dim=2)  # [1, T, H, Hd]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale  # [1, H, T, T]
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)


def test_run_with_cache_is_the_trace_in_transformerlens_layouts(tiny):
    c = tiny.config
    logits, cache = tiny.run_with_cache(PROMPT)
    trace = tiny.run_with_trace(PROMPT)
    T = len(trace.tokens)
    assert torch.equal(logits[0], tiny.logits(PROMPT))
    assert list(cache) == lens_names_of(c) and len(cache) == len(lens_names_of(c))
    assert "blocks.0.attn.hook_q" not in cache and "hook_pos_embed" not in cache  # RoPE model
    for name in cache:  # every name equals clearlm's own recording, converted
        row = LENS_NAMES[name if name in LENS_NAMES else "blocks.{i}." + name.split(".", 2)[2]]
        target = trace[row.target.replace("{i}", name.split(".")[1]) if "{i}" in row.target
                       else row.target]
        if row.layout == "heads":
            assert torch.equal(cache[name], target.transpose(1, 2)), name
        elif row.layout == "same":
            assert torch.equal(cache[name], target), name
    # shapes as TransformerLens's: [batch, head_index, query_pos, key_pos], [batch, pos, head, d]
    H, K, Hd = c.n_heads, c.n_kv_heads, c.head_dim
    assert cache["blocks.1.attn.hook_pattern"].shape == (1, H, T, T)
    assert cache["blocks.0.attn.hook_rot_q"].shape == (1, T, H, Hd)
    assert cache["blocks.0.attn.hook_rot_k"].shape == (1, T, K, Hd)
    assert cache["blocks.0.attn.hook_v"].shape == (1, T, K, Hd)
    assert cache["blocks.0.attn.hook_z"].shape == (1, T, H, Hd)
    assert cache["blocks.0.mlp.hook_post"].shape == (1, T, c.d_ff)
    for i in range(c.n_layers):
        pattern = cache["pattern", i]
        assert torch.allclose(pattern.sum(-1), torch.ones(1, H, T), atol=1e-6)
        again = attention_from(cache["rot_q", i], cache["rot_k", i, "attn"], c.head_dim**-0.5)
        assert torch.allclose(pattern, again, atol=1e-6)
    # ln_final.hook_normalized is before the norm's weight: x / rms(x), recomputed here
    x = cache["resid_post", -1]
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps)
    assert torch.allclose(cache["ln_final.hook_normalized"], expected, atol=1e-6)
    assert torch.equal(cache["unembed.hook_in"], trace["final_norm"])
    # the shorthand, `in` and the loss
    assert cache["resid_pre", 1] is cache["blocks.1.hook_resid_pre"]
    assert cache["embed"] is cache["hook_embed"] and cache["v1"] is cache["blocks.1.attn.hook_v"]
    assert ("pattern", 0) in cache and "blocks.0.attn.hook_q" not in cache
    ids = tiny.to_tokens(PROMPT)
    loss = tiny.run_with_hooks(ids, return_type="loss")
    assert torch.allclose(loss, F.cross_entropy(logits[0, :-1], ids[0, 1:]), atol=1e-6)


def test_a_model_without_rope_has_hook_q_and_pos_embed(gpt2):
    ids = torch.tensor([[5, 9, 200, 7, 31]])
    _, cache = gpt2.run_with_cache(ids, names_filter=lambda n: n.startswith(("hook_", "blocks.1")))
    trace = gpt2.run_with_trace(ids[0].tolist())
    assert torch.equal(cache["q", 1], trace["blocks.1.attn.q"].transpose(1, 2))
    assert cache["blocks.1.attn.hook_k"].shape == (1, 5, 4, 16)
    assert cache["hook_pos_embed"].shape == (1, 5, 64)  # clearlm's (T, D), batch first
    assert torch.equal(cache["hook_embed"] + cache["hook_pos_embed"], trace["blocks.0.resid_pre"])
    pattern = attention_from(cache["q", 1], cache["k", 1], 16**-0.5)
    assert torch.allclose(cache["pattern", 1], pattern, atol=1e-6)
    assert not any("rot_" in n or "blocks.0" in n for n in cache)
    with pytest.raises(ClearLMError, match="no RoPE: use hook_q"):
        gpt2.run_with_cache(ids, names_filter=["blocks.0.attn.hook_rot_q"])
    assert gpt2.cfg.positional_embedding_type == "standard" and gpt2.cfg.normalization_type == "LN"


def test_lens_named_hooks_change_logits_exactly_as_clearlm_named_ones(tiny):
    tokens = tiny.to_tokens(PROMPT)
    plain = tiny.logits(PROMPT)

    def ablate(value, hook):  # TransformerLens's z: [batch, pos, head_index, d_head]
        value[:, :, 0, :] = 0
        return value

    lens = tiny.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", ablate)])[0]
    with tiny.hooks({"blocks.0.attn.z": lambda z, _: z.index_fill(2, torch.tensor([0]), 0.0)}):
        ours = tiny.logits(PROMPT)
    assert torch.equal(lens, ours) and (lens - plain).abs().max() > 1e-3
    # a kv head of the rotated keys: transposed for the hook, transposed back for the pass
    seen = []

    def drop_kv_head_1(k, hook):
        seen.append((hook.name, hook.layer(), tuple(k.shape)))
        k[:, :, 1] = 0  # [batch, pos, kv_head_index, d_head]

    with tiny.hooks(fwd_hooks=[("blocks.1.attn.hook_rot_k", drop_kv_head_1)]):
        lens = tiny.logits(PROMPT)
    with tiny.hooks({"blocks.1.attn.k": lambda k, _: k.index_fill(1, torch.tensor([1]), 0.0)}):
        ours = tiny.logits(PROMPT)
    assert torch.equal(lens, ours) and (lens - plain).abs().max() > 1e-3
    assert seen == [("blocks.1.attn.hook_rot_k", 1, (1, len(tokens[0]), 2, 16))]
    # a replacement of ln_final.hook_normalized goes back through the weight
    def double(x, hook):
        return 2 * x

    lens = tiny.run_with_hooks(tokens, fwd_hooks=[("ln_final.hook_normalized", double)])[0]
    with tiny.hooks({"final_norm": lambda x, _: 2 * x}):
        ours = tiny.logits(PROMPT)
    assert torch.allclose(lens, ours, atol=1e-5)
    assert not tiny.transformer.hooks.active  # everything was removed
    assert torch.equal(tiny.logits(PROMPT), plain)


def test_unknown_names_suggest_the_nearest_of_both_vocabularies(tiny):
    with pytest.raises(ClearLMError, match=r"did you mean 'blocks\.1\.attn\.pattern'\?"):
        tiny.add_hook("blocks.1.attn.patern", lambda x, _: None)
    with pytest.raises(ClearLMError, match=r"did you mean 'blocks\.0\.attn\.hook_pattern'\?"):
        tiny.run_with_cache("hi", names_filter=["blocks.0.attn.hook_patern"])
    with pytest.raises(ClearLMError, match=r"did you mean 'blocks\.0\.hook_resid_pre'\?"):
        tiny.run_with_hooks("hi", fwd_hooks=[("blocks.0.hook_resid_pr", lambda x, hook: x)])
    with pytest.raises(ClearLMError, match="no clearlm equivalent: clearlm has no hook point"):
        tiny.run_with_cache("hi", names_filter="blocks.0.ln1.hook_scale")
    with pytest.raises(ClearLMError, match=r"after RoPE: .*blocks\.1\.attn\.hook_rot_q"):
        tiny.add_hook("blocks.1.attn.hook_q", lambda x, _: None)
    with pytest.raises(ClearLMError, match="block 5 does not exist, the model has 2 blocks"):
        tiny.run_with_trace("hi", names=["blocks.5.hook_resid_post"])
    assert not tiny.transformer.hooks.active
    _, cache = tiny.run_with_cache("hi", names_filter="blocks.0.hook_resid_pre")
    with pytest.raises(KeyError, match="did you mean 'blocks.0.hook_resid_pre'"):
        cache["blocks.0.hook_resid_pr"]
    # sandwich norms (Gemma 2/3) and a final soft-cap: those outputs are not TL's
    gemma = dataclasses.replace(tiny.config, block="sandwich", final_logit_softcap=30.0)
    assert unavailable("blocks.{i}.hook_attn_out", gemma) is not None
    assert unavailable("unembed.hook_out", gemma) is not None
    assert "blocks.0.hook_mlp_out" not in lens_names_of(gemma)


def test_get_act_name_follows_transformerlens():
    assert get_act_name("k", 6, "a") == "blocks.6.attn.hook_k"
    assert get_act_name("pre", 2) == "blocks.2.mlp.hook_pre"
    assert get_act_name("embed") == "hook_embed"
    assert get_act_name("normalized", 27, "ln2") == "blocks.27.ln2.hook_normalized"
    assert get_act_name("scale4ln1") == "blocks.4.ln1.hook_scale"
    assert get_act_name("normalized") == "ln_final.hook_normalized"
    assert get_act_name("attn", 3) == "blocks.3.attn.hook_pattern"
    assert get_act_name("resid_post", 1) == "blocks.1.hook_resid_post"


# As TransformerLens's tutorials write it; only the load line differs from a HookedTransformer
# notebook ("from transformer_lens import HookedTransformer" ... from_pretrained("gpt2")).
NOTEBOOK = '''
import torch
import clearlm

torch.set_grad_enabled(False)
model = clearlm.load("smollm2-135m-instruct")

prompt = "The Eiffel Tower is in the city of"
tokens = model.to_tokens(prompt)
str_tokens = model.to_str_tokens(prompt)
paris, rome = model.to_single_token(" Paris"), model.to_single_token(" Rome")

def logit_diff(logits):
    return logits[0, -1, paris] - logits[0, -1, rome]

logits, cache = model.run_with_cache(tokens)
clean_diff = logit_diff(logits)
attention_pattern = cache["pattern", 0]
resid = cache["blocks.3.hook_resid_pre"]

def ablate_head_0(value, hook):
    value[:, :, 0, :] = 0
    return value

ablated_logits = model.run_with_hooks(
    tokens, return_type="logits", fwd_hooks=[("blocks.0.attn.hook_z", ablate_head_0)]
)
ablated_diff = logit_diff(ablated_logits)
'''


def test_a_transformerlens_notebook_runs_with_clearlm_load(smollm2, monkeypatch):
    # the session's SmolLM2 stands in for the load (saves ~6 s; the snippet is unchanged)
    monkeypatch.setattr(clearlm, "load", lambda name: smollm2)
    ns: dict = {}
    try:
        exec(compile(NOTEBOOK, "notebook", "exec"), ns)
    finally:
        torch.set_grad_enabled(True)  # the notebook turned autograd off for the process
    T, c = ns["tokens"].shape[1], smollm2.config
    assert ns["str_tokens"][:3] == ["The", " E", "iffel"] and len(ns["str_tokens"]) == T
    assert ns["attention_pattern"].shape == (1, c.n_heads, T, T)
    assert torch.allclose(ns["attention_pattern"].sum(-1), torch.ones(1, c.n_heads, T), atol=1e-5)
    trace = smollm2.run_with_trace(ns["prompt"], ["blocks.3.resid_pre", "blocks.0.attn.pattern"])
    assert torch.equal(ns["resid"], trace["blocks.3.resid_pre"])
    assert torch.equal(ns["attention_pattern"], trace["blocks.0.attn.pattern"])
    assert ns["clean_diff"] > 1  # " Paris" well above " Rome"
    # the same ablation through clearlm's own hook API gives the same logit difference
    with smollm2.hooks({"blocks.0.attn.z": lambda z, _: z.index_fill(2, torch.tensor([0]), 0.0)}):
        ours = smollm2.logits(ns["prompt"])
    assert torch.equal(ns["ablated_logits"][0], ours)
    assert ns["ablated_diff"] == ours[-1, ns["paris"]] - ours[-1, ns["rome"]]
    assert abs(ns["ablated_diff"] - ns["clean_diff"]) > 1e-3


def test_lens_hooks_are_checked_in_their_own_layout(tiny, gpt2):
    z = tiny.run_with_cache(PROMPT, names_filter=["blocks.0.attn.hook_z"])[1]["z", 0]
    with pytest.raises(ClearLMError) as e:
        tiny.run_with_hooks(PROMPT, fwd_hooks=[("blocks.0.attn.hook_z", lambda v, hook: v[0])])
    got, want = tuple(z.shape[1:]), tuple(z.shape)  # [batch, pos, head_index, d_head]
    assert str(e.value).startswith(f"hook on blocks.0.attn.hook_z returned {got} float32 on cpu; "
                                   f"expected {want} float32")  # fmt: skip
    # TransformerLens's [1, pos, d_model] position encoding replaces clearlm's (T, D)
    lens = gpt2.run_with_hooks(PROMPT, fwd_hooks=[("hook_pos_embed", lambda p, hook: 2 * p)])
    with gpt2.hooks({"pos": lambda p, _: 2 * p}):
        ours = gpt2.logits(PROMPT)
    assert torch.equal(lens[0], ours) and not gpt2.transformer.hooks.active


def test_run_with_cache_mistakes_are_one_line(tiny):
    from clearlm.errors import DeviceError

    with pytest.raises(DeviceError, match="unknown device 'gpu'"):
        tiny.run_with_cache(PROMPT, device="gpu")
    with pytest.raises(DeviceError, match="device 'cuda:99' is not available"):
        tiny.run_with_cache(PROMPT, device="cuda:99")
    with pytest.raises(ClearLMError, match="return_type='loss' needs at least 2 tokens.* is 1$"):
        tiny.run_with_cache(torch.tensor([[5]]), return_type="loss")
    _, cache = tiny.run_with_cache(PROMPT)
    with pytest.raises(DeviceError, match="cannot move the cache to 'gpu'"):
        cache.to("gpu")
    # TransformerLens's "k1" is hook_k, which a RoPE model records as hook_rot_k (after RoPE)
    with pytest.raises(KeyError) as e:
        cache["k1"]
    n, hint = len(cache), "did you mean 'blocks.1.attn.hook_rot_k'?"
    assert str(e.value) == f"'blocks.1.attn.hook_k' is not in this cache ({n} names); {hint}"
    assert isinstance(e.value, ClearLMError)
    blocks = "the model has 2 blocks (0 … 1, or -2 … -1 from the end)"
    with pytest.raises(ClearLMError) as e:
        cache["pattern", -3]
    assert str(e.value) == f"cache key ('pattern', -3): layer -3 does not exist, {blocks}"
    with pytest.raises(ClearLMError) as e:
        cache["k6"]
    assert str(e.value) == f"cache key 'k6': layer 6 does not exist, {blocks}"
    assert ("pattern", -3) not in cache and cache.get(("pattern", 2)) is None
    assert torch.equal(cache["pattern", -2], cache["blocks.0.attn.hook_pattern"])
