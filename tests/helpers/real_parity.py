"""Shared checks for real GGUF models against transformers loading the same file (float32)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import torch

TOL = 1e-3  # the bound; measured figures are printed


def hf_gguf_model(path: Path):
    """transformers' model on a GGUF file, every tensor dequantized to float32, in eval mode.

    transformers opens the file with ``gguf.GGUFReader`` twice (once for the config, once for
    the tensors); each parse of a 150k–262k-token vocabulary takes 15–30 s on 2 cores. During
    this one call the second open reuses the first reader (same file, same size and mtime):
    the reference reads the same bytes with the same reader, once."""
    import gguf
    from transformers import AutoModelForCausalLM

    original, readers = gguf.GGUFReader, {}

    def reader(file, mode="r"):
        st = Path(file).stat()
        key = (str(Path(file).resolve()), st.st_size, st.st_mtime_ns, mode)
        if key not in readers:
            readers[key] = original(file, mode)
        return readers[key]

    with mock.patch.object(gguf, "GGUFReader", reader):
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    return model.eval()


def last_logit_diff(ours, ref_model, ids: list[int]) -> float:
    """max |ours − reference| over the last position's logits, and over every position."""
    t = torch.tensor([ids])
    with torch.inference_mode():
        got = ours(t)[0].float()
        ref = ref_model(t).logits[0].float()
    return (got[-1] - ref[-1]).abs().max().item(), (got - ref).abs().max().item()


def greedy_matches_or_near_tie(ours_tokens: list[int], ref_model, ids: list[int], eos: int | None):
    """Compare greedy continuations. Where they differ, the reference's own top two
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


# The prompts the real-model parity tests share (model, compact load, distance): English,
# Chinese, code, a chat-formatted turn, digits and emoji.
PROMPTS = {
    "short": "The capital of France is",
    "cjk": "人工智能是计算机科学的一个分支，它",
    "code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "chat": "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "digits_emoji": "I have 3 cats 🐱 and 12 dogs 🐶. Together that makes",
}
