"""Weight transforms more than one family or format needs, written once.

Each is a small pure step of the loading chain (read → rename → fix layout → dequantize → tie →
check shapes → assign): split a fused projection, undo llama.cpp's RoPE row permutation, undo
the stored 1 + w of Gemma's norms, tie the output projection to the embedding. A family names
the ones it needs (``Family.convert``, ``GGUFArch``); family-only quirks stay in the family file.
"""

from __future__ import annotations

import re

import numpy as np
import torch

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError

StateDict = dict[str, torch.Tensor]


def split_qkv(state: StateDict, config: ModelConfig) -> StateDict:
    """Split each fused ``self_attn.qkv_proj`` (rows [Q | K | V], (out, in) layout) into
    q_proj, k_proj and v_proj, weights and biases (GPT-2's c_attn, Phi-3's qkv_proj, GGUF's
    ``attn_qkv``).

    Raises:
        InvalidModelFileError: the fused tensor does not have H·Hd + 2·K·Hd rows.
    """
    sizes = [config.n_heads * config.head_dim] + [config.n_kv_heads * config.head_dim] * 2
    out: StateDict = {}
    for name, t in state.items():
        if ".self_attn.qkv_proj." not in name:
            out[name] = t
            continue
        if t.shape[0] != sum(sizes):
            raise InvalidModelFileError(
                f"fused QKV tensor {name} has {t.shape[0]} rows, expected {sum(sizes)}"
            )
        # weight (H·Hd + 2·K·Hd, D) or bias (H·Hd + 2·K·Hd,) → three row blocks
        for proj, part in zip(("q", "k", "v"), torch.split(t, sizes, dim=0), strict=True):
            out[name.replace("qkv_proj", f"{proj}_proj")] = part.contiguous()
    return out


def split_gate_up(state: StateDict, config: ModelConfig) -> StateDict:
    """Split each fused ``mlp.gate_up_proj`` weight (2F, D), rows [gate | up] (transformers'
    ``gate, up = gate_up_proj(x).chunk(2, dim=-1)``), into gate_proj and up_proj, each (F, D).

    Raises:
        InvalidModelFileError: the fused tensor does not have 2·F rows.
    """
    out: StateDict = {}
    for name, t in state.items():
        if not name.endswith("mlp.gate_up_proj.weight"):
            out[name] = t
            continue
        if t.shape[0] != 2 * config.d_ff:
            raise InvalidModelFileError(
                f"fused gate/up tensor {name} has {t.shape[0]} rows, expected {2 * config.d_ff}"
            )
        gate, up = torch.chunk(t, 2, dim=0)  # (F, D) each
        out[name.replace("gate_up_proj", "gate_proj")] = gate.contiguous()
        out[name.replace("gate_up_proj", "up_proj")] = up.contiguous()
    return out


STACKED_EXPERTS = re.compile(r"\.mlp\.experts\.(gate|up|down)_proj\.weight$")


def split_experts(state: StateDict, config: ModelConfig) -> StateDict:
    """Split each stacked expert tensor ``layers.{i}.mlp.experts.{gate,up,down}_proj.weight``
    (llama.cpp's ``ffn_*_exps``: (E, F, D) or (E, D, F), experts in order) into
    ``experts.{e}.*_proj.weight``, one view of it per expert (no copy: each is a contiguous
    slice of the stacked tensor). Other tensors pass through.

    Raises:
        InvalidModelFileError: a stacked tensor that is not 3-D with n_experts slices.
    """
    out: StateDict = {}
    for name, t in state.items():
        m = STACKED_EXPERTS.search(name)
        if m is None:
            out[name] = t
            continue
        if t.dim() != 3 or t.shape[0] != config.n_experts:
            raise InvalidModelFileError(
                f"stacked expert tensor {name} has shape {tuple(t.shape)}, expected "
                f"({config.n_experts}, rows, columns): one matrix per expert"
            )
        prefix = name[: m.start()]
        for e in range(config.n_experts):
            out[f"{prefix}.mlp.experts.{e}.{m.group(1)}_proj.weight"] = t[e]  # (F, D) or (D, F)
    return out


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation so rotate-half RoPE gives the reference's numbers.

    Hugging Face Llama checkpoints apply RoPE to the two *halves* of each head (rotate_half:
    pairs (x_j, x_{j+Hd/2})). llama.cpp rotates *adjacent* pairs (x_{2j}, x_{2j+1}), so its
    converter (convert_hf_to_gguf.py, ``LlamaModel.permute``) reorders each head's output rows
    from [half0 | half1] to interleaved [h0_0, h1_0, h0_1, h1_1, ...]. This is the inverse.

    Args:
        w: (n_heads * Hd, D) projection weight as stored in the GGUF (rows = output features).
        n_heads: heads in this projection (n_heads for Q, n_kv_heads for K).

    Returns:
        (n_heads * Hd, D) weight with each head's rows in rotate-half order.
    """
    out_dim = w.shape[0]
    head_dim = out_dim // n_heads
    rest = w.shape[1:]
    w = w.reshape(n_heads, head_dim // 2, 2, *rest)  # (H, Hd/2, 2, D): interleaved pairs
    w = w.swapaxes(1, 2)  # (H, 2, Hd/2, D): first halves, then second halves
    return w.reshape(out_dim, *rest)


def unpermute_qk(name: str, w: np.ndarray, config: ModelConfig) -> np.ndarray:
    """:func:`unpermute_rope_rows` for a q_proj or k_proj weight (our name); others as they are."""
    if name.endswith("q_proj.weight"):
        return unpermute_rope_rows(w, config.n_heads)
    if name.endswith("k_proj.weight"):
        return unpermute_rope_rows(w, config.n_kv_heads)
    return w


def unshift_norm(name: str, w: np.ndarray, shift: float) -> np.ndarray:
    """A ``*norm.weight`` stored as shift + w (llama.cpp writes Gemma's as 1 + w, the scale its
    RMSNorm multiplies by) back to w, in float32 as transformers' Gemma2TensorProcessor does;
    any other tensor, or shift 0, as it is."""
    if shift and name.endswith("norm.weight"):
        return w - np.float32(shift)
    return w


def tie_head(state: StateDict, config: ModelConfig) -> StateDict:
    """With ``tie_word_embeddings`` the output projection is the embedding (one tensor, shared:
    ``Transformer`` re-ties the parameter after assigning). Otherwise unchanged."""
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state
