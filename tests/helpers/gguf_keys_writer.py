"""Tiny GGUF files with chosen metadata keys, written from transformers models the way
llama.cpp's converter writes them (shared by test_gguf_keys.py and test_gguf_parity.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGUFValueType
from hf_tiny import batch_tokens, llama_like_gguf_writer

from clearlm.loading.checkpoint import load_gguf_model


def add_key(w: gguf.GGUFWriter, key: str, value) -> None:
    """One metadata key with the GGUF type llama.cpp's converter would give the value."""
    if isinstance(value, list):
        w.add_array(key, value)
    elif isinstance(value, bool):
        w.add_key_value(key, value, GGUFValueType.BOOL)
    elif isinstance(value, int):
        w.add_key_value(key, value, GGUFValueType.UINT32)
    elif isinstance(value, float):
        w.add_key_value(key, value, GGUFValueType.FLOAT32)
    else:
        w.add_key_value(key, value, GGUFValueType.STRING)


def write_gguf(model, arch: str, path: Path, keys: dict, tensors: dict | None = None) -> Path:
    """A transformers model as llama.cpp's converter writes it (tensor names, Q/K rows permuted
    for "llama", Gemma norms as 1 + w, the tied head left out), plus `keys` under ``{arch}.``
    and extra `tensors` (F32)."""
    c = model.config
    w, names = llama_like_gguf_writer(model, arch, path)
    for key, value in keys.items():
        add_key(w, f"{arch}.{key}", value)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(a.shape)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            a = a + np.float32(1.0)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), a)
    for name, a in (tensors or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_vs_reference(hf_model, path: Path) -> float:
    """max |ours(file) − transformers(original model)| over 2 × 20 tokens, float32."""
    tokens = batch_tokens(length=20)
    ours = load_gguf_model(path).model
    with torch.inference_mode():
        return (ours(tokens) - hf_model(tokens).logits).abs().max().item()
