"""The page's Diff panel: model B against model A on one text, as JSON (``POST /api/diff``).

``clearlm ui -m A --diff B`` loads B once, next to A, after :func:`check_pair` has refused a pair
that :func:`clearlm.api.diff.diff` could never compare (another vocabulary, block count, d_model,
n_heads, n_kv_heads, head_dim, d_ff or tokenization of :data:`PROBE`). Each request then runs
both models on the same tokens through that function and returns
:meth:`ModelDiff.to_dict <clearlm.inspect.diff.ModelDiff.to_dict>` unchanged: per block and
point (attn.out, resid_mid, ffn.out, resid_post) the relative error ‖a − b‖/‖a‖ at every
position, the first block over the threshold, the logits' KL, top-1 agreement and both
perplexities. The page draws what it gets; nothing is recomputed there.

A text is held to the page's bounds (:func:`clearlm.inspect.analysis.check_prompt`): not empty,
at most ``MAX_PROMPT_CHARS`` characters and ``MAX_PROMPT_TOKENS`` tokens (or the context length
less one, if smaller), so the answer stays a few hundred kB (N × 4 × T numbers).
"""

from __future__ import annotations

from typing import Any

from clearlm.api.diff import diff
from clearlm.api.model import Model
from clearlm.inspect.analysis import UIError, check_prompt
from clearlm.inspect.diff import check_comparable

# Encoded by both tokenizers when the page starts: ASCII words and punctuation, digits, runs of
# spaces, a tab and a newline, accented Latin, CJK and an emoji, so two tokenizers that merely
# share a vocabulary size are told apart before the server starts. Each request's text is
# checked again by diff() itself.
PROBE = 'The quick brown fox, 1234567890!  x\t=\n"naïve café" 東京 🙂 def f(x): return x'

NO_DIFF = (
    "no second model to compare with: start the page as 'clearlm ui -m MODEL --diff B' "
    "to compare B with MODEL"
)


def check_pair(a: Any, b: Any) -> None:
    """Refuse a pair the Diff panel cannot compare, before B's weights are read.

    Args:
        a, b: Models, or the weightless headers :func:`clearlm.api.model.load` hands its
            ``check`` callback (anything with ``.config`` and ``.encode``).

    Raises:
        ModelsDifferError: vocabulary sizes, block counts, d_model, n_heads, n_kv_heads,
            head_dim or d_ff differ, or the two
            tokenizers encode :data:`PROBE` differently (one line naming the difference).
    """
    check_comparable(a.config, b.config, a.encode(PROBE), b.encode(PROBE))


def diff_json(a: Model, b: Model | None, text: str, threshold: float) -> dict[str, Any]:
    """B against A on ``text``: :meth:`ModelDiff.to_dict` of :func:`clearlm.api.diff.diff`.

    Raises:
        UIError: no second model (the page was started without ``--diff``), an empty text or
            one over the page's bounds. ModelsDifferError: the two tokenizers encode this text
            differently.
    """
    if b is None:
        raise UIError(NO_DIFF)
    for m in (a, b):
        check_prompt(m, text)
    return diff(a, b, text, threshold=threshold).to_dict()
