"""Tiny randomly initialised transformers models, saved as safetensors folders, and the parity
checks every family runs against them (logits over a batch; greedy decoding with the cache)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from clearlm.generation.loop import decode_step, new_cache, prefill
from clearlm.loading.hf import load_hf_model

VOCAB = 320
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def save_tiny(model_cls, config, folder: Path, seed: int = 0):
    """Build model_cls(config) with a fixed seed, widen its random weights a little (so greedy
    decoding rarely meets near-ties), save it as safetensors, return the eval-mode model."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln" in name:
                p.add_(torch.randn_like(p) * 0.1)  # norms start at 1 (or 0): perturb them
            else:
                p.normal_(0, 0.08)
    model.save_pretrained(folder)
    return model


def batch_tokens(seed: int = 1, batch: int = 2, length: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)  # (B, T)


def max_logit_diff(hf_model, folder: Path, tokens: torch.Tensor) -> float:
    """max |ours − transformers'| over every position of a batch of sequences."""
    ours = load_hf_model(folder).model
    with torch.inference_mode():
        ref = hf_model(tokens).logits.float()
        got = ours(tokens).float()
    assert got.shape == ref.shape
    return (got - ref).abs().max().item()


def greedy_ours(folder: Path, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens from our prefill + decode_step loop (KV cache)."""
    model = load_hf_model(folder).model
    cache = new_cache(model, 1, len(prompt) + n)
    logits = prefill(model, torch.tensor([prompt]), cache)
    out = []
    for _ in range(n):
        tok = int(logits[0].argmax())
        out.append(tok)
        logits = decode_step(model, torch.tensor([[tok]]), cache)
    return out


def greedy_reference(hf_model, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()


def dequantized_reference(hf_model, arch: str, path: Path, back: dict[str, str]):
    """The original transformers model holding the file's weights, dequantized by gguf.quants
    (what transformers' GGUF loader does, for an architecture it does not read)."""
    state = {}
    for t in GGUFReader(str(path)).tensors:
        a = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        name = back[t.name]
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            a = a - np.float32(1.0)
        state[name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    ref = copy.deepcopy(hf_model)
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding
    return ref.eval()


def build_case(cases: dict, name: str, tmp_path_factory):
    """Fixture body shared by the family tests: (name, transformers model, its folder)."""
    model_cls, config = cases[name]
    folder = tmp_path_factory.mktemp(name)
    return name, save_tiny(model_cls, config, folder), folder


def check_logits(case, tol: float = 1e-4) -> None:
    """Logits over a batch of 2 × 20 tokens equal transformers' within tol (float32)."""
    name, hf_model, folder = case
    diff = max_logit_diff(hf_model, folder, batch_tokens(length=20))
    print(f"\n{name}: max |Δlogit| = {diff:.2e}")
    assert diff <= tol


def check_greedy(case) -> None:
    """24 greedy tokens after an 8-token prompt (past the small sliding windows the family
    tests configure) equal transformers' generate."""
    _, hf_model, folder = case
    prompt = batch_tokens(seed=2, batch=1, length=8)[0].tolist()
    assert greedy_ours(folder, prompt, 24) == greedy_reference(hf_model, prompt, 24)


def llama_like_gguf_writer(model, arch: str, path: Path):
    """A GGUFWriter with the keys llama.cpp's converter writes for every Llama-style config
    (context, widths, heads, RMSNorm ε, vocab size); the caller adds its family's own keys.

    Returns (writer, HF-name → GGUF-name map)."""
    import gguf

    c = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], c.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    return w, names
