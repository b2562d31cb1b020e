"""Model families: each module holds everything about one family, in both formats.

A family module defines ``FAMILIES`` (config.json ``model_type`` → :class:`Family`) and
``GGUF_ARCHS`` (llama.cpp ``general.architecture`` → :class:`GGUFArch`, empty where llama.cpp has
none). ``MODULES`` below is the one list the registry is built from: adding a family means
adding its module and naming it here. ``base.py`` holds what every family shares (the
dataclasses, the RoPE and head-size GGUF keys) and ``transforms.py`` the weight rewrites
several families use (llama.cpp's Q/K row permutation, Gemma's 1 + w norms, a tied head).

May import ``clearlm.config`` and ``clearlm.errors`` only: the loaders import the families,
never the other way round.
"""

from __future__ import annotations

from typing import TypeVar

from clearlm.errors import UnsupportedModelError
from clearlm.families import gemma, gpt2, llama, mixtral, olmoe, opt, phi3, qwen_moe, xglm
from clearlm.families.base import Family, GGUFArch, HFConfig

MODULES = (llama, gpt2, opt, xglm, gemma, phi3, mixtral, qwen_moe, olmoe)

FAMILIES: tuple[Family, ...] = tuple(f for m in MODULES for f in m.FAMILIES)
BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}
ARCHITECTURES: dict[str, GGUFArch] = {a.name: a for m in MODULES for a in m.GGUF_ARCHS}


T = TypeVar("T")


def _lookup(table: dict[str, T], key: str | None, what: str, source: str) -> T:
    """table[key], or UnsupportedModelError naming ``what`` and listing the supported keys."""
    if key is None or key not in table:
        raise UnsupportedModelError(
            f"{source}: {what} {key!r} is not supported; supported: " + ", ".join(table)
        )
    return table[key]


def family_for(model_type: str | None, source: str) -> Family:
    """The family for a config.json ``model_type``; UnsupportedModelError listing the rest."""
    return _lookup(dict(sorted(BY_MODEL_TYPE.items())), model_type, "model_type", source)


def gguf_arch(name: str | None, source: str) -> GGUFArch:
    """The GGUF architecture for ``general.architecture``; UnsupportedModelError listing the
    supported ones."""
    return _lookup(ARCHITECTURES, name, "architecture", source)


__all__ = ["ARCHITECTURES", "FAMILIES", "MODULES", "Family", "GGUFArch", "HFConfig"]
__all__ += ["family_for", "gguf_arch"]
