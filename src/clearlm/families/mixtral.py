"""Mixtral (Jiang et al. 2024, "Mixtral of Experts"; config.json model_type "mixtral"):
Mistral's attention with a sparse mixture of experts in place of every FFN, read from
transformers' ``models/mixtral/modeling_mixtral.py`` (v5).

- stage 3: a router (``block_sparse_moe.gate``) picks ``num_experts_per_tok`` of
  ``num_local_experts`` SwiGLU experts (``experts.{e}.w1`` gate, ``w3`` up, ``w2`` down, each of
  width ``intermediate_size``) and always renormalises their probabilities (model/moe.py).

GGUF: llama.cpp writes Mixtral as architecture "llama" with ``llama.expert_count`` and
``llama.expert_used_count`` and the stacked expert tensors (``ffn_gate_inp``, ``ffn_*_exps``);
that architecture lives in llama.py, with every Llama-style file. Old GGUFs with one tensor per
expert (``blk.{i}.ffn_gate.{e}.weight``, before llama.cpp's April 2024 format) are refused as
unknown tensors.
"""

from __future__ import annotations

from typing import Any

from clearlm.families.base import Family, HFConfig
from clearlm.families.llama import mistral_config

MIXTRAL_RENAMES = (
    (r"\.block_sparse_moe\.", ".mlp."),
    (r"(\.experts\.\d+)\.w1\.", r"\1.gate_proj."),
    (r"(\.experts\.\d+)\.w3\.", r"\1.up_proj."),
    (r"(\.experts\.\d+)\.w2\.", r"\1.down_proj."),
)


def mixtral_config(c: HFConfig) -> dict[str, Any]:
    """MixtralConfig keys → ModelConfig fields: Mistral's, plus the experts (every layer)."""
    return dict(
        mistral_config(c),
        n_experts=int(c.req("num_local_experts")),
        n_experts_used=int(c.req("num_experts_per_tok")),
        norm_topk_prob=True,  # MixtralTopKRouter always divides by the top-k sum
    )


MIXTRAL = Family("Mixtral", ("mixtral",), mixtral_config, renames=MIXTRAL_RENAMES)
FAMILIES = (MIXTRAL,)
GGUF_ARCHS: tuple = ()  # llama.cpp's "llama" (llama.py) reads Mixtral's files
