"""The format-free end of the loading chain: tie → check shapes → assign into a Transformer.

Each format reads, renames and fixes its tensors (loading/gguf.py, loading/hf.py), then hands
our parameter names to :func:`assemble`; loading/checkpoint.py chooses the format.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from clearlm.config import ModelConfig
from clearlm.errors import InvalidModelFileError
from clearlm.families.transforms import tie_head
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
    weights: str = "float32"  # "compact" when some matrices stay block-quantized
    weight_bytes: int = 0  # bytes the weights hold in memory (each shared tensor once)

    @property
    def tensor_types(self) -> dict[str, str]:
        return {t.name: t.type for t in self.tensors}


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and persistent buffers, each storage counted once (a
    tied head shares the embedding's)."""
    seen: dict[int, int] = {}
    for t in (*model.parameters(), *model.state_dict().values()):
        if not t.is_meta:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def return_freed_memory() -> None:
    """Give the heap pages freed during a load back to the system (glibc's ``malloc_trim``).

    glibc keeps freed memory in its arenas for reuse; after a compact load the packing
    temporaries of the worker threads stay resident that way (Gemma 3 270M: 30 MiB, measured
    with VmRSS before and after). A no-op where the C library has no malloc_trim."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def check_shapes(
    model: Transformer, state: dict[str, torch.Tensor], source: str, meta_only: bool = False
) -> None:
    """Every tensor must have exactly the shape its parameter expects (nanoGPT's import check).

    With ``meta_only`` the expected tensors are those still on the meta device (the compact
    load fills the packed modules first, then checks the rest against ``state``).

    Raises:
        InvalidModelFileError: naming the first tensor whose shape differs, a missing one, or
            one the model has no place for.
    """
    expected = {
        k: tuple(v.shape) for k, v in model.state_dict().items() if v.is_meta or not meta_only
    }
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


_SKELETON_LOCK = threading.Lock()


class _Skeleton(Transformer):
    """A Transformer whose derived tables (RoPE, sinusoids) are left for after loading."""

    def init_derived(self) -> None:
        pass


@contextmanager
def _no_init() -> Iterator[None]:
    """nn.Linear / nn.Embedding skip their random init (as transformers' ``no_init_weights``):
    on the meta device it computes nothing, but ``normal_`` there runs through torch's Python
    references and imports torch._dynamo (about 1 s of CPU time at the first load)."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    with _SKELETON_LOCK:
        nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None  # type: ignore[method-assign]
        try:
            yield
        finally:
            nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved  # type: ignore[method-assign]


def skeleton(config: ModelConfig) -> Transformer:
    """The model's modules on the meta device: shapes, no memory, no init. The caller assigns
    every weight, then calls ``init_derived()`` for the RoPE / sinusoid tables."""
    with _no_init(), torch.device("meta"):
        model = _Skeleton(config)
    model.__class__ = Transformer
    return model


def assemble(config: ModelConfig, state: dict[str, torch.Tensor], source: str) -> Transformer:
    """Tie → check shapes → assign into a module built on the meta device.

    Building on the meta device and assigning the loaded tensors
    (``load_state_dict(assign=True)``) means the weights are never held twice in memory.
    """
    state = tie_head(state, config)
    model = skeleton(config)
    check_shapes(model, state, source)
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    # RoPE and sinusoid tables are derived, not stored in the file: compute them for real.
    model.init_derived()
    return model.eval()
