"""What the page shows, computed from the public API: pure functions from a model and a prompt
to plain JSON-ready data. The web layer (:mod:`clearlm.ui.app`) only validates and routes.

Every number comes from one forward pass, :meth:`Model.run_with_trace`, read through the
:class:`~clearlm.inspect.trace.Trace`: tokens, attention patterns, the logit lens
(:meth:`Trace.logit_lens`, the one ``Model.logit_lens`` returns), the next-token distribution
(softmax of the last position's logits) and which tokens survive the sampling chain
(:func:`explain_sampling` on those logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clearlm.api.model import Model
from clearlm.errors import ClearLMError
from clearlm.inspect.sampling_explain import explain_sampling
from clearlm.inspect.token_pieces import token_pieces
from clearlm.inspect.trace import lens_names, pattern_names
from clearlm.sampling.chain import SamplingParams, softmax

# The page draws a T × T heatmap per head: beyond a few hundred tokens it is unreadable and the
# JSON grows as T². The model's own context limit is checked by the API as well.
MAX_PROMPT_CHARS = 4000
MAX_PROMPT_TOKENS = 256
TOP = 20  # tokens listed in the distribution, the logit lens and the sampling survivors


class UIError(ClearLMError):
    """A request the page cannot serve (empty or too long prompt, layer out of range, ...)."""


@dataclass(frozen=True)
class Analysis:
    """One prompt, run once: what every endpoint reads from.

    Attributes:
        ids: the prompt's token ids (T,).
        text: each token's string.
        patterns: attention weights, (N, H, T, T) float32: layer, head, query, key.
        lens: the logit lens at the last position, (N + 1, V) float32 probabilities.
        distribution: P(next token | prompt), (V,) float32.
        last_logits: the last position's logits, (V,) float32, for the sampling chain.
    """

    ids: list[int]
    text: list[str]
    patterns: torch.Tensor
    lens: torch.Tensor
    distribution: torch.Tensor
    last_logits: torch.Tensor


def check_prompt(model: Model, prompt: str) -> list[int]:
    """The prompt's token ids, or UIError saying why the page won't show it."""
    if not prompt.strip():
        raise UIError("the prompt is empty; type some text")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UIError(
            f"the prompt has {len(prompt)} characters; the page takes at most {MAX_PROMPT_CHARS}"
        )
    ids = model.encode(prompt)
    limit = min(MAX_PROMPT_TOKENS, model.config.context_length - 1)
    if len(ids) > limit:
        raise UIError(f"the prompt has {len(ids)} tokens; the page shows at most {limit}")
    return ids


def analyze(model: Model, prompt: str) -> Analysis:
    """Run the prompt through the model once (:meth:`Model.run_with_trace`) and read every view
    from that trace: attention patterns, the logit lens, the next-token distribution."""
    check_prompt(model, prompt)
    n = model.config.n_layers
    trace = model.run_with_trace(prompt, [*pattern_names(n), *lens_names(n), "logits"])
    last_logits = trace["logits"][0, -1].float()  # (V,)
    return Analysis(
        ids=list(trace.tokens),
        text=list(trace.text),
        patterns=trace.patterns(),  # (N, H, T, T)
        lens=trace.logit_lens(-1),  # (N + 1, V)
        distribution=trace.probs[-1],  # (V,)
        last_logits=last_logits,
    )


def label(model: Model, i: int) -> str:
    """A token id as text (special tokens spelled out, partial characters as <0xE6>)."""
    return token_pieces(model.tokenizer, [int(i)])[0]


def top_tokens(model: Model, probs: torch.Tensor, k: int = TOP) -> list[dict[str, Any]]:
    """The k most likely entries of a (V,) distribution as ``{"id", "label", "p"}``."""
    p, idx = torch.topk(probs, min(k, probs.numel()))
    return [
        {"id": int(i), "label": label(model, int(i)), "p": float(v)}
        for v, i in zip(p, idx, strict=True)
    ]


def summary(model: Model, a: Analysis) -> dict[str, Any]:
    """Tokens, logit lens and distribution (attention is fetched per layer/head)."""
    lens_rows = ["embed"] + [f"block {i}" for i in range(model.config.n_layers)]
    return {
        "tokens": [{"id": i, "text": t} for i, t in zip(a.ids, a.text, strict=True)],
        "n_layers": int(a.patterns.shape[0]),
        "n_heads": int(a.patterns.shape[1]),
        "lens": [
            {"layer": name, "top": top_tokens(model, a.lens[r], 3)}
            for r, name in enumerate(lens_rows)
        ],
        "distribution": top_tokens(model, a.distribution),
    }


def attention(a: Analysis, layer: int, head: int) -> dict[str, Any]:
    """One head's (T, T) attention pattern as nested lists (rows: queries, columns: keys)."""
    n, h = a.patterns.shape[:2]
    if not 0 <= layer < n:
        raise UIError(f"layer {layer} is out of range; the model has layers 0 to {n - 1}")
    if not 0 <= head < h:
        raise UIError(f"head {head} is out of range; the model has heads 0 to {h - 1}")
    return {"layer": layer, "head": head, "pattern": a.patterns[layer, head].tolist()}


def sampling(model: Model, a: Analysis, params: SamplingParams, top: int = TOP) -> dict[str, Any]:
    """What the sampling chain keeps of the last position's logits (explain_sampling), for the page.

    Returns ``steps`` (explanation rows: step, setting, active, kept, removed, top), the final
    ``survivors`` (renormalised, most likely first; for greedy only the argmax), ``kept`` (how
    many tokens can still be drawn) and ``candidates``: the unfiltered distribution's top tokens,
    each with whether it survives and its renormalised probability (0 when removed).
    """
    history = torch.tensor(a.ids, dtype=torch.long)  # (S,) for the repetition penalty
    why = explain_sampling(a.last_logits, history, params, top=top)
    rows = why.rows(_Labels(model))
    if params.is_greedy:  # the argmax is the only token that can come out
        after = torch.zeros_like(a.distribution)  # (V,)
        after[why.token] = 1.0
        alive = after > 0  # (V,) bool
        survivors = [{"id": why.token, "label": label(model, why.token), "p": 1.0}]
    else:  # the sampler's own chain; equals the last explained step's distribution
        z = why.filtered  # (V,), -inf where removed: filter_logits's output
        after, alive = softmax(z), ~torch.isneginf(z)  # (V,) each
        survivors = rows[-2]["top"]
    candidates = [
        {**c, "kept": bool(alive[c["id"]]), "p_after": float(after[c["id"]])}
        for c in top_tokens(model, a.distribution, top)
    ]
    return {
        "steps": rows[:-1],
        "survivors": survivors,
        "kept": int(alive.sum()),
        "candidates": candidates,
    }


def sample(model: Model, a: Analysis, prompt: str, params: SamplingParams) -> dict[str, Any]:
    """Draw one token as the sampler would (seeded when params.seed is set) and append it."""
    history = torch.tensor(a.ids, dtype=torch.long)
    why = explain_sampling(a.last_logits, history, params, top=1)
    piece = label(model, why.token)
    return {
        "token": {"id": why.token, "label": piece, "p": why.probability},
        "prompt": prompt + model.tokenizer.decode([why.token]),  # the text, not the label
    }


class _Labels:
    """Lazy ``labels[id]`` for :meth:`SamplingExplanation.rows`: decodes only what is asked."""

    def __init__(self, model: Model):
        self.model = model

    def __getitem__(self, i: int) -> str:
        return label(self.model, i)


# Patching runs the corrupted prompt once per cell: the page keeps the grid to a few seconds.
MAX_PATCH_CELLS = 1200


def patching(
    model: Model, clean: str, corrupted: str, answer: str, wrong: str, points: str
) -> dict[str, Any]:
    """The activation-patching grid of a clean/corrupted pair (:meth:`Model.patch`) as JSON:
    :meth:`PatchResult.to_dict <clearlm.inspect.patching.PatchResult.to_dict>`.

    ``points`` is comma-separated, as the CLI's --points. Raises UIError for an empty or too
    long prompt or a grid over MAX_PATCH_CELLS cells, ClearLMError for what Model.patch refuses.
    """
    check_prompt(model, clean)
    check_prompt(model, corrupted)
    names = [p.strip() for p in points.split(",") if p.strip()]
    _, _, rows, cols, _, _ = model.patch_inputs(
        clean, corrupted, names, None, answer, wrong, token_ids=False
    )
    if len(rows) * len(cols) > MAX_PATCH_CELLS:
        raise UIError(
            f"the grid has {len(rows)} hook points × {len(cols)} positions; the page patches at "
            f"most {MAX_PATCH_CELLS} cells: shorten the prompts or choose fewer points"
        )
    return model.patch(clean, corrupted, names, answer=answer, wrong=wrong).to_dict()
