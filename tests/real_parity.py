"""Shared checks for real GGUF models against transformers loading the same file (float32)."""

from __future__ import annotations

import torch

TOL = 1e-3  # the bound; measured figures are printed


def last_logit_diff(ours, ref_model, ids: list[int]) -> float:
    """max |ours − reference| over the last position's logits, and over every position."""
    t = torch.tensor([ids])
    with torch.inference_mode():
        got = ours(t)[0].float()
        ref = ref_model(t).logits[0].float()
    return (got[-1] - ref[-1]).abs().max().item(), (got - ref).abs().max().item()


def greedy_matches_or_near_tie(ours_tokens: list[int], ref_model, ids: list[int], eos: int | None):
    """Compare 32-token greedy continuations. Where they differ, the reference's own top two
    logits at that step must be within 1e-3 (a near-tie that float rounding may break either
    way). Returns (diverged_at or None, top-2 gap)."""
    with torch.inference_mode():
        out = ref_model.generate(
            torch.tensor([ids]),
            max_new_tokens=len(ours_tokens) if ours_tokens else 32,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    ref = out[0, len(ids) :].tolist()
    if ours_tokens == ref:
        return None, None
    i = next(
        (j for j in range(min(len(ours_tokens), len(ref))) if ours_tokens[j] != ref[j]),
        min(len(ours_tokens), len(ref)),
    )
    with torch.inference_mode():
        step = ref_model(torch.tensor([ids + ref[:i]])).logits[0, -1]
    top2 = step.topk(2).values
    return i, (top2[0] - top2[1]).item()
