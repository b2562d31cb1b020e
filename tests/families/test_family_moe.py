"""Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE against tiny random transformers models (d_model 64,
2 layers, 4 experts, 2 per token): logits, greedy decoding with the cache, the router's choice
read from the hook points, ties in the router, the GGUF format (experts stacked as llama.cpp
stores them; float32 and compact Q8_0), and the experts run on only the rows routed to them."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from hf_tiny import TINY, batch_tokens, build_case, check_greedy, check_logits, save_tiny
from moe_gguf import write_moe_gguf
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    OlmoeConfig,
    OlmoeForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from clearlm.loading.checkpoint import load_gguf_model
from clearlm.loading.hf import load_hf_model
from clearlm.model.hooks import HOOK_POINTS
from clearlm.model.moe import MoE
from clearlm.quant.linear import QuantLinear

TOL = 1e-4
EXPERTS = dict(num_experts=4, num_experts_per_tok=2)
CASES = {
    "mixtral": (
        MixtralForCausalLM,
        MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2),
    ),
    # a shared expert with its sigmoid gate, no renormalisation, layer 1 dense (mlp_only_layers)
    "qwen2_moe": (
        Qwen2MoeForCausalLM,
        Qwen2MoeConfig(**TINY, **EXPERTS, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48, mlp_only_layers=[1]),
    ),
    "qwen3_moe": (
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig(**TINY, **EXPERTS, moe_intermediate_size=32, head_dim=16,
                       norm_topk_prob=True),
    ),
    "olmoe": (OlmoeForCausalLM, OlmoeConfig(**TINY, **EXPERTS, clip_qkv=0.5)),
}
GGUF_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
             "olmoe": "olmoe"}


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tmp_path_factory):
    return build_case(CASES, request.param, tmp_path_factory)


def test_logits_match_transformers(tiny):
    check_logits(tiny, TOL)


def test_greedy_with_cache_matches_transformers(tiny):
    check_greedy(tiny)


def transformers_choice(hf_model, tokens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(router logits (N, E), chosen experts (N, k)) of each sparse layer, from transformers'
    output_router_logits and its routers' own top-k (``*TopKRouter.forward``)."""
    with torch.inference_mode():
        out = hf_model(tokens, output_router_logits=True)
    k = hf_model.config.num_experts_per_tok
    return [(lg, torch.topk(torch.softmax(lg.float(), -1), k, dim=-1).indices)
            for lg in out.router_logits]


def recorded_choice(folder, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    model = load_hf_model(folder).model
    names = {n for n in model.hooks.points if n.endswith((".router_logits", ".expert_ids"))}
    with model.hooks.recording(names) as rec, torch.inference_mode():
        model(tokens)
    return rec


def test_router_hooks_record_transformers_choice(tiny):
    """blocks.{i}.ffn.router_logits (B, T, E) and expert_ids (B, T, k) equal transformers'
    router logits and top-k experts, layer by layer (the dense layer of qwen2_moe has none)."""
    name, hf_model, folder = tiny
    tokens = batch_tokens(length=9)  # (2, 9)
    rec = recorded_choice(folder, tokens)
    sparse = sorted({int(n.split(".")[1]) for n in rec})
    ref = transformers_choice(hf_model, tokens)
    assert len(ref) == len(sparse) == (1 if name == "qwen2_moe" else 2)
    k, e = hf_model.config.num_experts_per_tok, 4
    for i, (logits, ids) in zip(sparse, ref, strict=True):
        got_ids = rec[f"blocks.{i}.ffn.expert_ids"]
        assert got_ids.shape == (2, 9, k) and got_ids.dtype == torch.int64
        assert torch.equal(got_ids.reshape(-1, k), ids), (name, i)
        got_logits = rec[f"blocks.{i}.ffn.router_logits"]
        assert got_logits.shape == (2, 9, e)
        assert (got_logits.reshape(-1, e) - logits).abs().max() <= TOL


def test_router_ties_are_broken_as_transformers(tmp_path):
    """A router of zeros: every expert has probability 1/E. The experts chosen are torch.topk's
    (transformers' call) among equal values: [2, 3] of 4 on CPU, not the lowest indices."""
    cls, config = CASES["mixtral"]
    hf_model = save_tiny(cls, config, tmp_path)
    with torch.no_grad():
        hf_model.model.layers[0].mlp.gate.weight.zero_()
    hf_model.save_pretrained(tmp_path)
    tokens = batch_tokens(length=6)
    rec = recorded_choice(tmp_path, tokens)
    (_, ref0), _ = transformers_choice(hf_model, tokens)
    got = rec["blocks.0.ffn.expert_ids"].reshape(-1, 2)
    assert torch.equal(got, ref0)
    assert {tuple(sorted(r)) for r in got.tolist()} == {(2, 3)}  # torch's order, documented


def test_hook_table_shapes_and_forced_experts(tiny):
    """The MoE points have the table's shapes; forcing every token onto expert 0 and 1 through
    the expert_ids hook reweights them by the router's own probabilities."""
    name, _, folder = tiny
    model = load_hf_model(folder).model
    c = model.config
    assert "blocks.{i}.ffn.expert_ids" in HOOK_POINTS
    block = next(i for i, layer in enumerate(model.layers) if isinstance(layer.mlp, MoE))
    tokens = batch_tokens(length=5)
    forced = torch.tensor([0, 1][: c.n_experts_used]).expand(2, 5, -1)
    hooks = {f"blocks.{block}.ffn.expert_ids": lambda ids, _: forced}
    want = {f"blocks.{block}.ffn.{p}" for p in ("expert_ids", "expert_weights", "out")}
    with model.hooks.temporary(hooks), model.hooks.recording(want) as rec, torch.inference_mode():
        model(tokens)
    assert torch.equal(rec[f"blocks.{block}.ffn.expert_ids"], forced)
    assert rec[f"blocks.{block}.ffn.expert_weights"].shape == (2, 5, c.n_experts_used)
    assert rec[f"blocks.{block}.ffn.out"].shape == (2, 5, c.d_model)
    if c.norm_topk_prob:
        sums = rec[f"blocks.{block}.ffn.expert_weights"].sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums))


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_float32_matches_transformers(name, tmp_path):
    """The same weights as llama.cpp's converter writes them (experts stacked, Mixtral's Q/K
    rows permuted, architecture "llama" with expert counts) give transformers' logits."""
    cls, config = CASES[name]
    hf_model = save_tiny(cls, config, tmp_path)
    if name == "qwen2_moe":  # GGUF "qwen2moe" has no dense FFN tensors: every layer sparse
        hf_model = save_tiny(cls, Qwen2MoeConfig(**{**config.to_dict(), "mlp_only_layers": []}),
                             tmp_path)
    path = tmp_path / "f32.gguf"
    write_moe_gguf(hf_model, GGUF_ARCH[name], path)
    ours = load_gguf_model(path)
    assert ours.config.n_experts == 4 and ours.config.n_experts_used == 2
    tokens = batch_tokens(length=12)
    with torch.inference_mode():
        diff = (ours.model(tokens) - hf_model(tokens).logits).abs().max().item()
    print(f"\n{name} GGUF F32: max |Δlogit| = {diff:.2e}")
    assert diff <= TOL


@pytest.mark.parametrize("qtype", ["Q8_0", "F16", "BF16"])
def test_gguf_experts_stay_compact(tmp_path, qtype, capsys):
    """Mixtral in Q8_0 / F16 / BF16: each expert's matrices are row bands (Q8_0: QuantLinear)
    or views (16-bit: HalfLinear) of the stacked tensor, with no float32 copy and no warning;
    the weights held stay ≤ 1.15 × the file's tensor bytes, and the logits equal the float32
    load of the same file (the same values; sums in another order)."""
    from clearlm.quant.half import HalfLinear

    cls, config = CASES["mixtral"]
    hf_model = save_tiny(cls, config, tmp_path)
    path = tmp_path / "experts.gguf"
    write_moe_gguf(hf_model, "llama", path, GGMLQuantizationType[qtype])
    compact = load_gguf_model(path, weights="compact")
    assert "warning" not in capsys.readouterr().err
    floats = load_gguf_model(path)
    experts = compact.model.layers[0].mlp.experts
    layers = [getattr(x, p) for x in experts for p in ("gate_proj", "up_proj", "down_proj")]
    assert all(isinstance(m, QuantLinear if qtype == "Q8_0" else HalfLinear) for m in layers)
    if qtype != "Q8_0":  # 16-bit: views of one stacked tensor (Q8_0's gate/up get fused)
        assert len({m.weight.untyped_storage().data_ptr() for m in layers[0::3]}) == 1
    file_bytes = sum(t.n_bytes for t in __import__("gguf").GGUFReader(str(path)).tensors)
    assert compact.weight_bytes <= 1.15 * file_bytes
    tokens = batch_tokens(length=12)
    with torch.inference_mode():
        diff = (compact.model(tokens) - floats.model(tokens)).abs().max().item()
    assert diff <= TOL


def test_experts_see_only_their_rows(tmp_path):
    """A batch of 2 × 7 tokens: each expert runs once per layer on the rows routed to it (N·k
    rows in all, not N·E), and a decode step of 2 rows equals each row decoded alone."""
    cls, config = CASES["mixtral"]
    save_tiny(cls, config, tmp_path)
    model = load_hf_model(tmp_path).model
    calls: list[int] = []
    handles = [x.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[0]))
               for layer in model.layers for x in layer.mlp.experts]
    tokens = batch_tokens(length=7)
    with torch.inference_mode():
        batch = model(tokens)
    for h in handles:
        h.remove()
    assert sum(calls) == 2 * 7 * 2 * len(model.layers)  # N·k rows per layer
    assert len(calls) <= 4 * len(model.layers)  # at most one product per expert and layer
    with torch.inference_mode():
        rows = torch.cat([model(tokens[b : b + 1]) for b in range(2)])
    assert (batch - rows).abs().max() <= 1e-5

