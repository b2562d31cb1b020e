"""clearlm: run real open-weight LLMs through a readable, from-scratch decoder-only Transformer.

import clearlm
model = clearlm.load()                     # SmolLM2-135M-Instruct, from its GGUF file
print(model.generate("Once upon a time", max_new_tokens=32, temperature=0).text)
probs = model.next_token_distribution("The capital of France is")  # (V,) float32
"""

from clearlm import threads
from clearlm.api import Model, load
from clearlm.config import ModelConfig
from clearlm.errors import (
    ClearLMError,
    ContextLengthError,
    InvalidModelFileError,
    ModelNotFoundError,
    PromptTypeError,
    SamplingError,
    SamplingParamsError,
    UnsupportedModelError,
)
from clearlm.generation import Chunk, GenerationResult
from clearlm.sampling import SamplingParams

__all__ = [
    "Chunk",
    "ClearLMError",
    "ContextLengthError",
    "GenerationResult",
    "InvalidModelFileError",
    "Model",
    "ModelConfig",
    "ModelNotFoundError",
    "SamplingError",
    "PromptTypeError",
    "SamplingParams",
    "SamplingParamsError",
    "UnsupportedModelError",
    "load",
    "threads",
]
