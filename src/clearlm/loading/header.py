"""A model's header: what can be known before any weight is read.

:func:`read_header` gives the config, the metadata, the tokenizer (with its chat template) and,
for a Hugging Face folder, the generation_config.json defaults. ``clearlm.load(check=...)`` uses
it to refuse a bad input (no chat template, a prompt longer than the context) before the slow
part, and then reuses it, so the file is opened and the tokenizer built once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from clearlm.config import ModelConfig
from clearlm.loading.gguf import open_gguf, read_metadata
from clearlm.tokenizer import Tokenizer


@dataclass
class Header:
    """Config, metadata and tokenizer of a model file or folder; ``reader`` is the open GGUF
    (None for a folder), to be handed on to :func:`clearlm.loading.load.load_gguf_model`."""

    config: ModelConfig
    metadata: dict[str, Any]
    tokenizer: Tokenizer
    reader: GGUFReader | None = None
    generation_defaults: dict[str, Any] = field(default_factory=dict)


def read_header(path: Path) -> Header:
    """Read a .gguf file's metadata or a folder's config.json and tokenizer files.

    Raises:
        ModelNotFoundError, InvalidModelFileError, UnsupportedModelError.
    """
    if path.is_dir():
        from clearlm.defaults import read_generation_config
        from clearlm.loading.hf import inspect_hf

        config, metadata, _ = inspect_hf(path)
        tokenizer = Tokenizer.from_hf_folder(path)
        return Header(config, metadata, tokenizer, None, read_generation_config(path).values)
    reader = open_gguf(path)
    metadata = read_metadata(reader)
    config = ModelConfig.from_gguf(metadata, {t.name for t in reader.tensors}, path.name)
    tokenizer = Tokenizer.from_gguf_metadata(metadata, source=path.name)
    return Header(config, metadata, tokenizer, reader)
