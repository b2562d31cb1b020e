"""Perplexity of a text under a model, with a sliding window (as transformers' docs compute it).

PPL = exp( (1/N) Σ_t −log p(x_t | x_<t) ) over the N predicted tokens. A text longer than the
context is scored in windows of ``context`` tokens that start every ``stride`` tokens; each
window scores only the tokens the previous window did not. With stride < context every token
after the first is predicted exactly once, with at least ``context − stride`` tokens of left
context; with stride == context the windows do not overlap and each window's first token goes
unscored, as in the reference.
(transformers documentation, "Perplexity of fixed-length models".)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from clearlm.errors import ClearLMError, ContextLengthError, SamplingParamsError
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import log_softmax


@dataclass(frozen=True)
class Perplexity:
    """Result: perplexity, total negative log-likelihood (nats) and tokens predicted."""

    perplexity: float
    nll: float
    n_predicted: int
    n_windows: int

    @property
    def mean_nll(self) -> float:
        return self.nll / self.n_predicted


def windows(n_tokens: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first_scored) for each window: tokens [begin, end) are fed, positions
    first_scored … end−1 are scored (always ≥ begin + 1: the window's first token has no
    prediction)."""
    out = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + context, n_tokens)
        first = max(prev_end, begin + 1)
        if first < end:
            out.append((begin, end, first))
        prev_end = end
        if end == n_tokens:
            break
    return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@torch.inference_mode()
def perplexity(
    model: Transformer,
    tokens: Sequence[int],
    context: int | None = None,
    stride: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Perplexity:
    """Sliding-window perplexity of a token sequence.

    Args:
        model: the Transformer.
        tokens: token ids (at least 2).
        context: window length in tokens (default and maximum: the model's context length).
        stride: tokens between window starts (default: context // 2).
        progress: called as progress(windows_done, windows_total).

    Raises:
        ClearLMError: fewer than 2 tokens.
        SamplingParamsError: context not an int >= 2 (a window of 1 token predicts nothing),
            stride not an int in [1, context]; None (not 0) means the default.
        ContextLengthError: context larger than the model's.
    """
    ctx_max = model.config.context_length
    if context is not None and (not _is_int(context) or context < 2):
        raise SamplingParamsError(
            f"--context (window length) must be an integer >= 2, got {context!r}: a window "
            "needs one token to predict from and one to score"
        )
    context = ctx_max if context is None else context
    if context > ctx_max:
        raise ContextLengthError(f"--context {context} exceeds the model's {ctx_max} tokens")
    if stride is not None and (not _is_int(stride) or not 1 <= stride <= context):
        raise SamplingParamsError(
            f"--stride must be an integer between 1 and the context ({context}), got {stride!r}"
        )
    stride = max(1, context // 2) if stride is None else stride
    if len(tokens) < 2:
        raise ClearLMError("the text has fewer than 2 tokens: nothing to predict")
    ids = torch.tensor([list(tokens)], dtype=torch.long)  # (1, N)
    spans = windows(ids.shape[1], context, stride)
    nll, count = 0.0, 0
    for i, (begin, end, first) in enumerate(spans):
        logits = model(ids[:, begin:end])[0]  # (end − begin, V)
        # position p predicts token p + 1: scored targets first … end−1 use logits first−1 … end−2
        logp = log_softmax(logits[first - begin - 1 : end - begin - 1].float()).cpu()
        targets = ids[0, first:end]
        nll -= logp.gather(-1, targets[:, None]).sum().item()
        count += end - first
        if progress is not None:
            progress(i + 1, len(spans))
    return Perplexity(math.exp(nll / count), nll, count, len(spans))
