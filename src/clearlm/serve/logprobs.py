"""Prompt logprobs (``echo`` + ``logprobs`` on /v1/completions) and the completions'
``logprobs`` object, OpenAI's legacy shape: ``tokens``, ``token_logprobs``, ``top_logprobs``
(a ``{piece: logprob}`` dict per token) and ``text_offset`` (each piece's character offset in
the choice's text).

A prompt's logprobs are the model's own: log-softmax of the raw logits of one forward pass over
the prompt (no sampling settings apply to a prompt, as in vLLM's prompt_logprobs); position t
scores token t + 1. The first token has none (``null``), as OpenAI returns it. This is what
lm-evaluation-harness's ``local-completions`` reads for loglikelihood (``echo: true``,
``logprobs``, ``max_tokens`` 0 or 1). Alternatives follow the generated tokens' rule: the ``N``
most likely, plus the prompt's own token ("up to logprobs + 1").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from clearlm.api.model import Model
from clearlm.engine import TokenEvent
from clearlm.sampling.chain import log_softmax
from clearlm.tokenizer import Tokenizer

FLOOR = -9999.0  # OpenAI's stand-in for log(0)


def finite(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


@dataclass
class Scored:
    """One prompt token: its id, its logprob given the tokens before it (None for the first)
    and the ``k`` most likely tokens at its position (None for the first)."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None


ROWS = 256  # positions per log-softmax: a (ROWS, V) float32 block at a time, not (T, V) twice


@torch.inference_mode()
def score_prompt(model: Model, ids: list[int], k: int) -> list[Scored]:
    """Each prompt token's log-probability under the model, and the ``k`` most likely tokens
    at its position (``torch.topk``'s order). One forward pass, no cache: logits (T, V); the
    log-softmax runs ROWS positions at a time."""
    logits = model.logits(ids)  # (T, V)
    out = [Scored(ids[0], None, None)]
    for start in range(0, len(ids) - 1, ROWS):
        lp = log_softmax(logits[start : start + ROWS])  # (R, V): row r scores token start+r+1
        nxt = torch.tensor(ids[start + 1 : start + 1 + len(lp)])  # (R,)
        own = lp[torch.arange(len(nxt)), nxt].tolist()  # (R,)
        values, top_ids = torch.topk(lp[: len(nxt)], k) if k else (None, None)  # (R, k)
        for r, token in enumerate(nxt.tolist()):
            top = [] if values is None else list(zip(top_ids[r].tolist(), values[r].tolist(),
                                                     strict=True))  # fmt: skip
            out.append(Scored(token, own[r], top))
    return out


def legacy(
    tokenizer: Tokenizer,
    entries: list[tuple[int, float | None, list[tuple[int, float]] | None]],
    offset: int,
) -> dict[str, list[Any]]:
    """The legacy ``logprobs`` object for (token, logprob, alternatives) entries; ``text_offset``
    counts the decoded pieces from ``offset``. Each ``top_logprobs`` dict holds the alternatives
    and the token itself (None where the logprob is None: the prompt's first token)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                 "text_offset": []}  # fmt: skip
    for token, lp, top in entries:
        piece = tokenizer.decode([token])
        out["tokens"].append(piece)
        out["token_logprobs"].append(None if lp is None else finite(lp))
        if lp is None:
            out["top_logprobs"].append(None)
        else:
            pairs = [*(top or []), (token, lp)]
            out["top_logprobs"].append({tokenizer.decode([t]): finite(v) for t, v in pairs})
        out["text_offset"].append(offset)
        offset += len(piece)
    return out


def completion_logprobs(
    tokenizer: Tokenizer, scored: list[Scored] | None, events: list[TokenEvent], echo: str
) -> dict[str, list[Any]]:
    """A choice's ``logprobs``: the prompt's entries first when it was scored (``echo`` with
    ``logprobs``), offsets from 0; then the generated tokens', offsets from ``len(echo)``."""
    gen = [(e.token, e.logprob, e.top_logprobs) for e in events]
    out = legacy(tokenizer, gen, len(echo))
    if scored:
        head = legacy(tokenizer, [(s.token, s.logprob, s.top) for s in scored], 0)
        out = {key: head[key] + out[key] for key in out}
    return out
