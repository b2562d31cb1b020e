"""``clearlm.diff(a, b, text)``: two versions of one model compared stage by stage on one text.

The numbers are :mod:`clearlm.inspect.diff`'s; this module only gets the two models (loading
names and paths, or taking loaded :class:`~clearlm.api.model.Model` objects), checks that they
share a tokenizer and a shape, and runs them on the same token ids.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from clearlm.api.model import Model, load
from clearlm.generation.loop import check_fits
from clearlm.inspect.diff import DEFAULT_THRESHOLD, ModelDiff, check_comparable, compare, record
from clearlm.inspect.token_pieces import token_pieces

ModelRef = Model | str | os.PathLike[str] | None
Pair = str | torch.dtype | None | tuple[str | torch.dtype | None, str | torch.dtype | None]


def _pair(value: Pair) -> tuple:
    """One setting for both sides, or an (A, B) pair."""
    return tuple(value) if isinstance(value, tuple | list) else (value, value)


def diff(
    a: ModelRef,
    b: ModelRef,
    text: str | Sequence[int],
    threshold: float = DEFAULT_THRESHOLD,
    weights: Pair = None,
    dtype: Pair = "float32",
) -> ModelDiff:
    """Model B against model A (the reference) on the same tokens, hook point by hook point.

    Args:
        a, b: loaded Models, or what :func:`clearlm.api.model.load` takes (a .gguf file, a
            Hugging Face folder, an alias; None: the default model). The same file twice with
            other ``weights`` or ``dtype`` compares two ways of running one model.
        text: the text (or token ids) both models run, in one forward pass each.
        threshold: relative error of the residual stream above which a block counts as the
            first that drifted (:attr:`ModelDiff.first_layer`).
        weights, dtype: for the models loaded here, one value for both or an (A, B) pair
            (``weights=("compact", "float32")``); ignored for loaded Models.

    Returns:
        A :class:`~clearlm.inspect.diff.ModelDiff`: relative errors (N, P, T), logit KL and
        top-1 agreement per position, both perplexities.

    Raises:
        ModelsDifferError (exit code 2): different vocabulary sizes, token ids, block counts,
        d_model, heads or d_ff. ContextLengthError: an empty text, or one longer than a model's
        context. And what loading raises.
    """
    weights_ab, dtypes = _pair(weights), _pair(dtype)
    models = [m if isinstance(m, Model) else load(m, dtype=d, weights=w, decode="eager")
              for m, w, d in zip((a, b), weights_ab, dtypes, strict=True)]
    ma, mb = models
    ids_a, ids_b = ma.encode(text), mb.encode(text)
    check_comparable(ma.config, mb.config, ids_a, ids_b)
    for m in models:  # ContextLengthError (empty, too long) before either pass
        check_fits(len(ids_a), m.config.context_length, new_tokens=0)
    rec_a, logits_a = record(ma.transformer, ids_a)
    rec_b, logits_b = record(mb.transformer, ids_b)
    return compare(rec_a, rec_b, logits_a, logits_b, ids_a,
                   token_pieces(ma.tokenizer, ids_a), threshold)
