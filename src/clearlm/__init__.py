"""clearlm: run real open-weight LLMs through a readable, from-scratch decoder-only Transformer.

import clearlm
model = clearlm.load()                     # SmolLM2-135M-Instruct, from its GGUF file
print(model.generate("Once upon a time", max_new_tokens=32, temperature=0).text)
probs = model.next_token_distribution("The capital of France is")  # (V,) float32
"""

import importlib
from typing import TYPE_CHECKING

# first, and now: its first look at the CPUs' load spans torch's import (clearlm.runtime.threads)
from clearlm.runtime import threads

if TYPE_CHECKING:  # what the names below are, for type checkers and editors
    from clearlm.api.diff import diff
    from clearlm.api.model import Model, load
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
    from clearlm.generation.loop import Chunk, GenerationResult
    from clearlm.sampling.params import SamplingParams

# Each public name and the module it lives in. They are imported on first use (PEP 562), so
# that ``clearlm --help`` and the command line's usage errors do not wait for torch (~3 s).
_WHERE = {
    "Model": "clearlm.api.model",
    "load": "clearlm.api.model",
    "diff": "clearlm.api.diff",
    "ModelConfig": "clearlm.config",
    "Chunk": "clearlm.generation.loop",
    "GenerationResult": "clearlm.generation.loop",
    "SamplingParams": "clearlm.sampling.params",
    **dict.fromkeys(
        ["ClearLMError", "ContextLengthError", "InvalidModelFileError", "ModelNotFoundError",
         "PromptTypeError", "SamplingError", "SamplingParamsError", "UnsupportedModelError"],
        "clearlm.errors",
    ),
}


def __getattr__(name: str):
    """``clearlm.load`` and the other public names, imported when first read; a submodule
    (``clearlm.sampling.chain``, ``clearlm.text``) too, as after the eager import it replaces.

    Raises:
        AttributeError: no such name or submodule.
    """
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value  # later reads skip this function
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")  # also sets it as an attribute
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":  # the submodule exists but an import inside failed
            raise
    raise AttributeError(f"module 'clearlm' has no attribute {name!r}", name=name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


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
    "diff",
    "load",
    "threads",
]
