"""One entry point for a checkpoint on disk: ``open_checkpoint(path)``, a GGUF file or a folder.

The format is chosen here, once, and every reader asks the checkpoint rather than the path:
``clearlm.load`` (api.py), ``clearlm info`` and ``perplexity`` (cli/inspect.py) and the
checks cli/loader.py makes before the weights. Opening costs nothing; each piece is read on
first use and kept, so the header read to check an input (config, tokenizer, chat template) is
the one the weights are then loaded with:

- ``has_chat_template()``: from the key names alone (loading/peek.py, milliseconds), or None
  where that cheap answer does not exist (a folder: its tokenizer files decide);
- ``config``, ``metadata``, ``tensors`` (name, type, shape; nothing dequantized), ``tokenizer``,
  ``generation_config``, ``size_bytes``, ``tokenizer_kind``: the header;
- ``load(dtype, weights)``: the weights, through the format's chain, into a ready Transformer:
  ``weights="compact"`` keeps a GGUF's block-quantized matrices packed (loading/compact/load.py),
  ``"float32"`` dequantizes every tensor (the reference path). A folder's weights are float.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from clearlm.config import ModelConfig
from clearlm.loading import peek
from clearlm.loading.compact.load import CompactPlan, compact_plan, load_compact
from clearlm.loading.generation_config import read_generation_config
from clearlm.loading.gguf import load_tensors, open_gguf, read_config, read_metadata, tensor_infos
from clearlm.loading.gguf_file import GGUFFile
from clearlm.loading.held import FormatUse
from clearlm.loading.hf import inspect_hf, load_hf_model
from clearlm.loading.load import (
    LoadedModel,
    TensorInfo,
    assemble,
    held_bytes,
    return_freed_memory,
    skeleton,
)
from clearlm.sampling.defaults import FileDefaults
from clearlm.tokenizer import Tokenizer, tokenizer_from_gguf, tokenizer_from_hf_folder


class GGUFCheckpoint:
    """A .gguf file: metadata and tokenizer from its key/value section; weights packed or
    dequantized (``load``'s ``weights``)."""

    def __init__(self, path: Path) -> None:
        self.path, self.source = path, path.name

    def has_chat_template(self) -> bool | None:
        return peek.has_chat_template(self.path)

    @cached_property
    def reader(self) -> GGUFFile:
        """The memory-mapped file. Raises ModelNotFoundError, InvalidModelFileError."""
        return open_gguf(self.path)

    @cached_property
    def metadata(self) -> dict[str, Any]:
        return read_metadata(self.reader)

    @cached_property
    def config(self) -> ModelConfig:
        """Raises UnsupportedModelError, InvalidModelFileError (see config_from_gguf)."""
        return read_config(self.reader, self.metadata, self.source)

    @cached_property
    def tensors(self) -> list[TensorInfo]:
        return tensor_infos(self.reader)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return tokenizer_from_gguf(self.metadata, self.source)

    @property
    def tokenizer_kind(self) -> str:
        m = self.metadata
        return f"{m.get('tokenizer.ggml.model')} (pre-tokenizer {m.get('tokenizer.ggml.pre', '-')})"

    @property
    def generation_config(self) -> FileDefaults:
        return FileDefaults()  # a GGUF carries no sampling defaults clearlm reads

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size if self.path.is_file() else 0

    def planned_weights(self, weights: str) -> tuple[str, int, int]:
        """What ``load(float32, weights)`` would hold, from the header alone: (mode, bytes,
        matrices kept packed). Raises UnsupportedModelError for an unknown tensor name."""
        if weights != "compact":
            return "float32", sum(t.n_elements for t in self.tensors) * 4, 0
        plan = self.plan()
        n = len(plan.packed) + len(plan.half)
        return ("compact" if n else "float32"), plan.total_bytes, n

    def weight_formats(self, weights: str) -> list[tuple[str, FormatUse]]:
        """(GGUF type, how a load with ``weights`` holds its tensors: count, file and memory
        bytes), from the header alone; the compact plan's, or every tensor dequantized."""
        if weights == "compact":
            return [(q, use) for (q, _), use in self.plan().formats.items()]
        out: dict[str, FormatUse] = {}
        for t in self.reader.tensors:
            use = out.setdefault(t.tensor_type.name, FormatUse("float32, dequantized"))
            use.count, use.file_bytes = use.count + 1, use.file_bytes + t.n_bytes
            use.held_bytes += t.n_elements * 4
        return list(out.items())

    def plan(self) -> CompactPlan:
        """What a compact float32 load would pack (loading/gguf_compact.compact_plan), kept."""
        if "_plan" not in self.__dict__:
            self.__dict__["_plan"] = compact_plan(self.reader, self.config,
                                                  skeleton(self.config), torch.float32,
                                                  self.source)
        return self.__dict__["_plan"]

    def load(self, dtype: torch.dtype = torch.float32, weights: str = "float32") -> LoadedModel:
        """Header (kept) → pack or dequantize / rename / fix layout → tie → check → assign;
        then the file is unmapped (the model holds copies only).

        Raises ModelNotFoundError, InvalidModelFileError, UnsupportedModelError."""
        config, metadata, tensors, mode = self.config, self.metadata, self.tensors, "float32"
        if weights == "compact":
            model, plan = load_compact(self.reader, config, dtype, self.source)
            mode = "compact" if plan.packed or plan.half else "float32"  # all float: float
        else:
            model = assemble(config, load_tensors(self.reader, config, dtype, self.source),
                             self.source)
        self.__dict__.pop("reader").close()  # a later use maps the file again
        return_freed_memory()
        return LoadedModel(model, config, metadata, tensors, mode, held_bytes(model))


class FolderCheckpoint:
    """A Hugging Face folder: config.json, safetensors, tokenizer.json, generation_config.json."""

    def __init__(self, path: Path) -> None:
        self.path, self.source = path, path.name

    def has_chat_template(self) -> bool | None:
        return None  # no cheap answer: the tokenizer files are read with the header

    @cached_property
    def _header(self) -> tuple[ModelConfig, dict[str, Any], list[TensorInfo]]:
        return inspect_hf(self.path)

    @property
    def config(self) -> ModelConfig:
        return self._header[0]

    @property
    def metadata(self) -> dict[str, Any]:
        return self._header[1]

    @property
    def tensors(self) -> list[TensorInfo]:
        return self._header[2]

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return tokenizer_from_hf_folder(self.path)

    tokenizer_kind = "tokenizer.json"

    @cached_property
    def generation_config(self) -> FileDefaults:
        return read_generation_config(self.path)

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.glob("*.safetensors"))

    def planned_weights(self, weights: str) -> tuple[str, int, int]:
        """(mode, bytes, matrices kept 16-bit) a load holds, from the headers: float32, but with
        ``weights="compact"`` float16 / bfloat16 matrices (2-d) at their 2 bytes a value (a
        matrix the family converts is counted so too: an estimate)."""
        half = [t for t in self.tensors if weights == "compact" and len(t.shape) == 2
                and t.type.upper() in ("F16", "BF16", "FLOAT16", "BFLOAT16")]
        n = sum(t.n_elements for t in self.tensors) * 4 - sum(t.n_elements for t in half) * 2
        return ("compact" if half else "float32"), n, len(half)

    def load(self, dtype: torch.dtype = torch.float32, weights: str = "float32") -> LoadedModel:
        """config.json → safetensors → rename → convert → cast → tie → check shapes → assign;
        ``weights="compact"`` keeps float16 / bfloat16 matrices 16-bit (loading/compact/half.py)."""
        loaded = load_hf_model(self.path, dtype, compact=weights == "compact")
        loaded.weight_bytes = held_bytes(loaded.model)
        return loaded


Checkpoint = GGUFCheckpoint | FolderCheckpoint


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint at ``path``: a folder is a Hugging Face folder, anything else a GGUF file
    (a missing or non-GGUF file is reported when first read). Reads nothing yet."""
    path = Path(path)
    return FolderCheckpoint(path) if path.is_dir() else GGUFCheckpoint(path)


def load_gguf_model(
    path: str | os.PathLike[str], dtype: torch.dtype = torch.float32, weights: str = "float32"
) -> LoadedModel:
    """A .gguf file's model in one call (``GGUFCheckpoint(path).load(dtype, weights)``).

    Raises:
        ModelNotFoundError, InvalidModelFileError, UnsupportedModelError.
    """
    return GGUFCheckpoint(Path(path)).load(dtype, weights)
