"""A sparse mixture-of-experts FFN (seed stage 3, in place of the dense FFN).

Each token's FFN is a weighted sum of k of E gated FFNs (Shazeer et al. 2017, "Outrageously
Large Neural Networks"; Fedus et al. 2021, Switch Transformer; Jiang et al. 2024, Mixtral):

    p = softmax(x · W_routerᵀ)                     router probabilities over the E experts
    S = the k largest p_e  (torch.topk)            the token's experts
    w_e = p_e / Σ_{j∈S} p_j   (norm_topk_prob)     or w_e = p_e without renormalising
    MoE(x) = Σ_{e∈S} w_e · FFN_e(x)  [+ σ(x · g) · FFN_shared(x)]

as transformers computes it for every family clearlm reads (``*TopKRouter.forward``): the
softmax over all E logits in float32, then top-k, then the optional renormalisation. Mixtral
always renormalises, which equals a softmax over the k chosen logits; Qwen2-MoE (1.5-MoE) does
not, Qwen3-MoE does, OLMoE does not (config.json's ``norm_topk_prob``). Qwen2-MoE adds a
shared expert every token uses, scaled by a sigmoid gate of its own (``shared_expert_gate``).

Ties: experts with equal probabilities are chosen and ordered as ``torch.topk`` orders them,
the call transformers makes on the same float32 probabilities, so both pick the same experts.
That order is torch's, not the lowest index first: on CPU, four tied experts give
``topk(k=2)`` = [2, 3]. llama.cpp sorts with its own argsort and may pick others among ties.
tests/families/test_family_moe.py checks a router whose every probability ties.

Computation, grouped by expert (as transformers' ``*Experts.forward`` and vLLM's fused MoE do,
never every expert on every token): the (token, slot) pairs are sorted by expert, each expert
with at least one token multiplies the rows routed to it (``index_select``) in one product, and
its weighted rows are added back in place (``index_add_``); one host sync per layer (the
counts). Decode steps of any batch size take the same path.

Shape letters: B batch, T tokens, N = B·T rows, D d_model, E n_experts, k n_experts_used,
F expert_d_ff.
"""

from __future__ import annotations

import torch
from torch import nn

from clearlm.config import ModelConfig
from clearlm.model.ffn import GatedFFN
from clearlm.model.hooks import HookPoint


def is_moe_layer(config: ModelConfig, layer_idx: int) -> bool:
    """Whether block ``layer_idx`` has a mixture of experts (not a dense FFN)."""
    return config.n_experts > 0 and layer_idx not in config.dense_layers


class MoE(nn.Module):
    """Router → top-k experts → their weighted sum (module docstring), named as transformers'
    Qwen2-MoE / Qwen3-MoE / OLMoE blocks: ``gate`` (the router, E × D, no bias), ``experts.{e}``
    (each a :class:`~clearlm.model.ffn.GatedFFN` of width F), and where the family has one
    ``shared_expert`` with ``shared_expert_gate`` (1 × D).

    Hook points: ``router_logits`` (B, T, E), ``expert_ids`` (B, T, k) int64 in descending
    probability, ``expert_weights`` (B, T, k) the weights they are summed with, ``out``
    (B, T, D). A hook may replace the ids (force experts): the weights are then the router's
    probabilities of the new ids, renormalised as the family does.
    Shapes: (B, T, D) → (B, T, D).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.n_experts, self.top_k = config.n_experts, config.n_experts_used
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = nn.Linear(d, config.n_experts, bias=False)
        self.experts = nn.ModuleList(
            GatedFFN(config, config.expert_d_ff, hooks=False) for _ in range(config.n_experts)
        )
        self.has_shared = config.shared_expert_d_ff > 0
        if self.has_shared:
            self.shared_expert = GatedFFN(config, config.shared_expert_d_ff, hooks=False)
            self.shared_expert_gate = nn.Linear(d, 1, bias=False)
        self.hook_router_logits, self.hook_expert_ids = HookPoint(), HookPoint()
        self.hook_expert_weights, self.hook_out = HookPoint(), HookPoint()

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) → expert ids (B, T, k) int64 and their weights (B, T, k), x's dtype."""
        logits = self.hook_router_logits(self.gate(x))  # (B, T, E)
        probs = torch.softmax(logits.float(), dim=-1)  # (B, T, E) float32, as transformers
        _, ids = torch.topk(probs, self.top_k, dim=-1)  # (B, T, k): ties as torch.topk orders
        ids = self.hook_expert_ids(ids)
        weights = probs.gather(-1, ids)  # (B, T, k): topk's values, or a hook's ids' own
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return ids, self.hook_expert_weights(weights.to(x.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        ids, weights = self.route(x)
        flat = x.reshape(-1, D)  # (N, D)
        pair_expert = ids.reshape(-1)  # (N·k,): the expert of each (token, slot) pair
        order = torch.argsort(pair_expert, stable=True)  # (N·k,): pairs grouped by expert
        counts = torch.bincount(pair_expert, minlength=self.n_experts).tolist()  # host sync
        rows = order // self.top_k  # (N·k,): the token row of each sorted pair
        pair_weight = weights.reshape(-1)[order]  # (N·k,)
        out = torch.zeros_like(flat)  # (N, D)
        start = 0
        for e, n in enumerate(counts):  # ascending expert index, as transformers adds them
            if n == 0:
                continue
            r = rows[start : start + n]  # (n,): the tokens routed to expert e
            y = self.experts[e](flat.index_select(0, r))  # (n, D): one product per expert
            out.index_add_(0, r, y * pair_weight[start : start + n, None])
            start += n
        if self.has_shared:  # Qwen2-MoE: σ(x·g) · FFN_shared(x), every token
            shared = self.shared_expert(flat)  # (N, D)
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * shared
        return self.hook_out(out.view(B, T, D))
