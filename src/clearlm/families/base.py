"""What a model family is: how its Hugging Face config and weights map onto ours.

A family module holds only what differs from the shared layers (style.md, after mlx-lm): a
function from ``config.json`` to ModelConfig fields, the parameter-name mapping, and any weight
rewrites (fused projections split, Conv1D transposed).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from clearlm.config import ROPE_SCALINGS, ModelConfig, RopeScaling
from clearlm.errors import InvalidModelFileError, UnsupportedModelError

StateDict = dict[str, torch.Tensor]


class HFConfig:
    """A ``config.json`` dict with lookups that name the key and the file when one is missing."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def req(self, key: str) -> Any:
        """The value of a required key. Raises InvalidModelFileError naming key and file."""
        if self.data.get(key) is None:
            raise InvalidModelFileError(f"{self.source}: required key {key!r} is missing")
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value


def rope_from_hf(c: HFConfig, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """rope_theta and rope_scaling from either layout transformers writes.

    transformers ≥ 5 saves ``rope_parameters`` {"rope_type", "rope_theta", "factor", ...};
    older files have top-level ``rope_theta`` and ``rope_scaling`` {"type"|"rope_type", ...}.
    """
    p = dict(params if params is not None else c.get("rope_parameters") or {})
    legacy = c.get("rope_scaling") or {}
    theta = p.get("rope_theta", c.get("rope_theta", 10000.0))
    p = {**legacy, **p}
    kind = p.get("rope_type", p.get("type", "default"))
    if kind == "default":
        return {"rope_theta": float(theta), "rope_scaling": None}
    if kind not in ROPE_SCALINGS:
        raise UnsupportedModelError(
            f"{c.source}: rope scaling {kind!r} is not supported; supported: "
            + ", ".join(ROPE_SCALINGS)
        )
    original = p.get("original_max_position_embeddings", c.get("max_position_embeddings", 0))
    factor = float(p["factor"])
    scaling = RopeScaling(
        kind=kind,
        factor=factor,
        original_context=int(original),
        low_freq_factor=float(p.get("low_freq_factor", 1.0)),
        high_freq_factor=float(p.get("high_freq_factor", 4.0)),
        **(_yarn_from_hf(p, factor) if kind == "yarn" else {}),
    )
    out: dict[str, Any] = {"rope_theta": float(theta), "rope_scaling": scaling}
    if kind == "dynamic":
        # max_position_embeddings stays the trained length; dynamic NTK exists to run past it.
        out["context_length"] = int(scaling.original_context * scaling.factor)
    return out


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature √(1/t) = 0.1·ln(s) + 1 (Peng et al. 2023, eq. 22)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_from_hf(p: dict[str, Any], factor: float) -> dict[str, Any]:
    """YaRN's optional keys, with transformers' defaults (_compute_yarn_parameters)."""
    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all:  # DeepSeek's form
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention = yarn_mscale(factor)
    return dict(
        beta_fast=float(p.get("beta_fast") or 32),
        beta_slow=float(p.get("beta_slow") or 1),
        attention_factor=float(attention),
        truncate=bool(p.get("truncate", True)),
    )


def decoder_core(c: HFConfig) -> dict[str, Any]:
    """The fields every Llama-style config.json spells the same way (rope_from_hf may
    override context_length)."""
    d_model = int(c.req("hidden_size"))
    n_heads = int(c.req("num_attention_heads"))
    return dict(
        vocab_size=int(c.req("vocab_size")),
        d_model=d_model,
        n_layers=int(c.req("num_hidden_layers")),
        n_heads=n_heads,
        n_kv_heads=int(c.get("num_key_value_heads", n_heads)),
        head_dim=int(c.get("head_dim", d_model // n_heads)),
        d_ff=int(c.req("intermediate_size")),
        norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        context_length=int(c.req("max_position_embeddings")),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


HF_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}


def activation_from_hf(name: str, source: str) -> str:
    """transformers' ACT2FN name → ours; UnsupportedModelError for others."""
    if name not in HF_ACTIVATIONS:
        raise UnsupportedModelError(
            f"{source}: activation {name!r} is not supported; supported: "
            + ", ".join(HF_ACTIVATIONS)
        )
    return HF_ACTIVATIONS[name]


def strip_model_prefix(name: str) -> str | None:
    """transformers' Llama-style names are ours behind a ``model.`` prefix."""
    return name.removeprefix("model.")


@dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
        name: display name ("Llama", "Gemma 2", ...).
        model_types: the ``model_type`` values of config.json this family reads.
        config: HFConfig → ModelConfig fields (``architecture`` is filled in by the loader).
        renames: (regex, replacement) pairs applied in order to each checkpoint name, after
            the ``model.`` prefix is stripped; a name mapped to "" is dropped (unused buffers).
        convert: rewrites the renamed state dict (split fused projections, transpose Conv1D).
    """

    name: str
    model_types: tuple[str, ...]
    config: Callable[[HFConfig], dict[str, Any]]
    renames: tuple[tuple[str, str], ...] = ()
    convert: Callable[[StateDict, ModelConfig], StateDict] = field(default=lambda s, c: s)
    prefixes: tuple[str, ...] = ("model.",)

    def rename(self, name: str) -> str:
        for prefix in self.prefixes:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        for pattern, repl in self.renames:
            name = re.sub(pattern, repl, name)
        return name

    def build_config(self, c: HFConfig, model_type: str) -> ModelConfig:
        return ModelConfig(architecture=model_type, family=self.name, **self.config(c))
