"""The Python API: ``model = clearlm.load(...)``; ``model.generate(prompt, ...)``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from clearlm.config import ModelConfig
from clearlm.errors import ClearLMError
from clearlm.generation import Chunk, GenerationResult, generate, stream_generate
from clearlm.loading.load import load_gguf_model
from clearlm.model.transformer import Transformer
from clearlm.models import resolve_model
from clearlm.sampling import SamplingParams, softmax
from clearlm.tokenizer import Tokenizer

Messages = Sequence[dict[str, str]]


@dataclass
class Model:
    """A loaded model: the Transformer, its tokenizer, config and the file's metadata.

    Build one with :func:`load`. Every method takes text (or token ids) and runs on the CPU in
    the parameters' dtype.
    """

    transformer: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    metadata: dict[str, Any]
    tensor_types: dict[str, str]
    path: str
    generation_defaults: dict[str, Any] = field(default_factory=dict)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Text → token ids (BOS added when the file asks for it); ids pass through unchanged."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        ids = [int(i) for i in prompt]
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ClearLMError(
                f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})"
            )
        return ids

    def chat_prompt(self, messages: str | Messages) -> list[int]:
        """Render a conversation with the file's chat template and tokenize it.

        A plain string is one user message. The rendered text already holds any BOS the
        template writes, so no second one is added.
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    @torch.inference_mode()
    def logits(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """Logits at every position of the prompt: (T, V) float, no cache."""
        ids = torch.tensor([self.encode(prompt)], dtype=torch.long)  # (1, T)
        return self.transformer(ids)[0]

    @torch.inference_mode()
    def next_token_distribution(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """P(next token | prompt): softmax of the last position's logits, (V,) float32."""
        ids = torch.tensor([self.encode(prompt)], dtype=torch.long)  # (1, T)
        return softmax(self.transformer(ids, last_only=True)[0, -1].float())

    def stream(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        stop: Sequence[str] = (),
        params: SamplingParams | None = None,
        **sampling: Any,
    ) -> Iterator[Chunk]:
        """Yield :class:`~clearlm.generation.Chunk` s as tokens are generated.

        Sampling settings come either as ``params`` or as keywords (temperature, top_k, top_p,
        min_p, repetition_penalty, seed). Raises SamplingParamsError, ContextLengthError.
        """
        params = params or SamplingParams(**sampling)
        return stream_generate(
            self.transformer, self.tokenizer, self.encode(prompt), params, max_new_tokens, stop
        )

    def generate(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        stop: Sequence[str] = (),
        params: SamplingParams | None = None,
        on_text: Callable[[str], None] | None = None,
        **sampling: Any,
    ) -> GenerationResult:
        """Generate a continuation of a text (or token ids) and return it whole.

        Args:
            prompt: text, tokenized as is (no chat template), or a list of token ids.
            max_new_tokens: most tokens to generate.
            stop: strings that end generation (not included in the text).
            params / sampling keywords: see :class:`~clearlm.sampling.SamplingParams`.
            on_text: called with each new piece of text as it is produced.

        Raises:
            SamplingParamsError: invalid sampling values. ContextLengthError: prompt too long.
        """
        params = params or SamplingParams(**sampling)
        ids = self.encode(prompt)
        return generate(
            self.transformer, self.tokenizer, ids, params, max_new_tokens, stop, on_text
        )

    def chat(
        self,
        messages: str | Messages,
        max_new_tokens: int = 256,
        stop: Sequence[str] = (),
        params: SamplingParams | None = None,
        on_text: Callable[[str], None] | None = None,
        **sampling: Any,
    ) -> GenerationResult:
        """Like :meth:`generate`, for a conversation rendered with the model's chat template."""
        params = params or SamplingParams(**sampling)
        ids = self.chat_prompt(messages)
        return generate(
            self.transformer, self.tokenizer, ids, params, max_new_tokens, stop, on_text
        )


def load(model: str | os.PathLike[str] | None = None, dtype: torch.dtype = torch.float32) -> Model:
    """Load a model from a .gguf file, a Hugging Face folder, or an alias.

    Args:
        model: a path to a GGUF file, a folder with config.json + safetensors +
            tokenizer.json, an alias (see ``clearlm.models.ALIASES``), or None (the default).
        dtype: parameter dtype: torch.float32 (reference numerics) or torch.bfloat16.

    Raises:
        ModelNotFoundError, InvalidModelFileError, UnsupportedModelError.
    """
    path = resolve_model(model)
    defaults: dict[str, Any] = {}
    if path.is_dir():
        from clearlm.loading.hf import generation_defaults, load_hf_model

        loaded = load_hf_model(path, dtype)
        tokenizer = Tokenizer.from_hf_folder(path)
        defaults = generation_defaults(path)
    else:
        loaded = load_gguf_model(path, dtype)
        tokenizer = Tokenizer.from_gguf_metadata(loaded.metadata, source=path.name)
    return Model(
        loaded.model,
        tokenizer,
        loaded.config,
        loaded.metadata,
        loaded.tensor_types,
        str(path),
        defaults,
    )
