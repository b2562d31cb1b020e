"""Shared checks for real GGUF models against transformers loading the same file (float32)."""

from __future__ import annotations

import functools
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import torch

TOL = 1e-3  # the bound; measured figures are printed


# gguf.GGUFReader parses every metadata value of a file into numpy views: 4 s (SmolLM2's 49k
# tokens) to 16 s (Gemma 3's 262k) on 2 cores, for each open. transformers opens the file once for
# a model's config, once for its tensors and once for a tokenizer; inside _one_reader_per_file the
# opens of one call share one parse (the reader is dropped after: it holds up to ~0.7 GB).
@contextmanager
def _one_reader_per_file():
    """While inside, ``gguf.GGUFReader(file)`` returns the reader already parsed inside for the
    same file (same resolved path, size and mtime) and mode."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def reader(file, mode="r"):
        st = Path(file).stat()
        key = (str(Path(file).resolve()), st.st_size, st.st_mtime_ns, mode)
        if key not in readers:
            readers[key] = original(file, mode)
        return readers[key]

    with mock.patch.object(gguf, "GGUFReader", reader):
        yield


def hf_gguf_model(path: Path):
    """transformers' model on a GGUF file, every tensor dequantized to float32, in eval mode.

    transformers reads the file with ``gguf.GGUFReader`` twice (config, then tensors); the
    second read reuses the first parse: the reference reads the same bytes with the same reader."""
    from transformers import AutoModelForCausalLM

    with _one_reader_per_file():
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    return model.eval()


@functools.cache
def hf_gguf_tokenizer(path: Path):
    """transformers' tokenizer built from the same GGUF, once per session (Gemma 3: ~25 s, of
    which ~15 s parse the file; :func:`hf_gguf_model_and_tokenizer` shares that parse)."""
    from transformers import AutoTokenizer

    with _one_reader_per_file():
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def hf_gguf_model_and_tokenizer(path: Path):
    """(:func:`hf_gguf_model`, :func:`hf_gguf_tokenizer`) of one file, built on one parse of it;
    the tokenizer is the session's (other tests asking for it later get it at once)."""
    with _one_reader_per_file():
        return hf_gguf_model(path), hf_gguf_tokenizer(path)


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
