"""The format-free end of the loading chain: tie → check shapes → assign into a Transformer.

Each format reads, renames and fixes its tensors (loading/gguf.py, loading/hf.py), then hands
our parameter names to :func:`assemble`; loading/checkpoint.py chooses the format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError
from clearlm.loading.transforms import tie_head
from clearlm.model.transformer import Transformer


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the file stores it: name, storage type, shape in (out, in) order."""

    name: str
    type: str
    shape: tuple[int, ...]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class LoadedModel:
    """What one checkpoint gives: the model, its config, the file's metadata, its tensors."""

    model: Transformer
    config: ModelConfig
    metadata: dict[str, Any]
    tensors: list[TensorInfo]

    @property
    def tensor_types(self) -> dict[str, str]:
        return {t.name: t.type for t in self.tensors}


def check_shapes(model: Transformer, state: dict[str, torch.Tensor], source: str) -> None:
    """Every tensor must have exactly the shape its parameter expects (nanoGPT's import check).

    Raises:
        InvalidModelFileError: naming the first tensor whose shape differs, a missing one, or
            one the model has no place for.
    """
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, shape in expected.items():
        if name not in state:
            raise InvalidModelFileError(f"{source}: tensor for {name} is missing")
        if tuple(state[name].shape) != shape:
            raise InvalidModelFileError(
                f"{source}: tensor {name} has shape {tuple(state[name].shape)}, expected {shape}"
            )
    extra = sorted(set(state) - set(expected))
    if extra:
        raise InvalidModelFileError(
            f"{source}: unexpected tensor {extra[0]} (and {len(extra) - 1} more)"
        )


def assemble(config: ModelConfig, state: dict[str, torch.Tensor], source: str) -> Transformer:
    """Tie → check shapes → assign into a module built on the meta device.

    Building on the meta device and assigning the loaded tensors
    (``load_state_dict(assign=True)``) means the weights are never held twice in memory.
    """
    state = tie_head(state, config)
    with torch.device("meta"):
        model = Transformer(config)
    check_shapes(model, state, source)
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # RoPE and sinusoid tables are derived, not stored in the file: compute them for real.
    model.init_derived()
    return model.eval()
