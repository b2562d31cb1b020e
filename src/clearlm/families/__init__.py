"""Model families: each module maps one family's checkpoints onto the shared layers.

FAMILIES lists every family; ``family_for(model_type)`` finds one by config.json's
``model_type``. Adding a family = one module + one line here.
"""

from __future__ import annotations

from clearlm.errors import UnsupportedModelError
from clearlm.families import gemma, gpt2, llama, opt, phi3, xglm
from clearlm.families.base import Family, HFConfig

FAMILIES: tuple[Family, ...] = (*llama.FAMILIES, *gpt2.FAMILIES, *opt.FAMILIES, *xglm.FAMILIES)
FAMILIES += (*gemma.FAMILIES, *phi3.FAMILIES)

BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def family_for(model_type: str | None, source: str) -> Family:
    """The family for a config.json ``model_type``; UnsupportedModelError listing the rest."""
    if model_type not in BY_MODEL_TYPE:
        raise UnsupportedModelError(
            f"{source}: model_type {model_type!r} is not supported; supported: "
            + ", ".join(sorted(BY_MODEL_TYPE))
        )
    return BY_MODEL_TYPE[model_type]


__all__ = ["FAMILIES", "Family", "HFConfig", "family_for"]
