"""`clearlm explain`'s numbers: one prompt through a real model, every stage, as plain data.

One traced forward pass (:meth:`clearlm.api.model.Model.run_with_trace`) gives everything: the
tokens,
the embeddings, the attention patterns of the chosen layers, each block's residual stream and
FFN activations, and the logits. The logit lens is the trace's own
(:meth:`clearlm.inspect.trace.Trace.logit_lens`, at every position). The sampling rows come
from :func:`clearlm.inspect.sampling_explain.explain_sampling`.
Printing (cli/explain.py), pictures (plots.py) and the page (report.py) only
lay these numbers out, so the tests check numbers here, not text.

Shape letters: T prompt tokens, N blocks, H heads, D d_model, F d_ff, V vocab, k top entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from clearlm.errors import ClearLMError, SamplingParamsError
from clearlm.inspect.sampling_explain import SamplingExplanation, explain_sampling
from clearlm.inspect.token_pieces import token_pieces
from clearlm.inspect.trace import lens_names
from clearlm.sampling.chain import SamplingParams, apply_temperature, softmax

if TYPE_CHECKING:
    from clearlm.api.model import Model

# Temperatures of the "next-token probabilities at several temperatures" picture.
TEMPERATURES = (0.5, 1.0, 2.0)
# The sampling settings the last stage compares; seeded, so the picks are reproducible.
SAMPLING_SETTINGS: tuple[tuple[str, SamplingParams], ...] = (
    ("greedy (T = 0)", SamplingParams(temperature=0.0)),
    ("temperature 0.7", SamplingParams(temperature=0.7, seed=0)),
    ("temperature 1.5", SamplingParams(temperature=1.5, seed=0)),
    ("top-k 5", SamplingParams(temperature=1.0, top_k=5, seed=0)),
    ("top-p 0.9", SamplingParams(temperature=1.0, top_p=0.9, seed=0)),
    ("T 0.7, top-k 50, top-p 0.9", SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=0)),
)


@dataclass(frozen=True)
class HeadFocus:
    """Where one head of one layer looks from the last token.

    Attributes:
        layer, head: the block and head index.
        positions: key positions with the largest attention weight, largest first (≤ k).
        weights: their weights, pattern[0, head, -1, positions].
    """

    layer: int
    head: int
    positions: tuple[int, ...]
    weights: tuple[float, ...]


@dataclass(frozen=True)
class Explanation:
    """Every stage of one forward pass over a prompt.

    Attributes:
        tokens: the prompt's ids (T,); text: each one decoded on its own.
        position: "rope", "learned" or "sinusoidal"; rope_theta: RoPE's base.
        embed_norms: (T,) L2 norm of each token's embedding vector (what block 0 gets, before
            any additive position); pos_norms: (T,) norms of the additive position vectors, or
            None for RoPE (positions rotate q and k inside attention instead).
        layers, heads: the blocks and heads shown in the attention stage.
        patterns: layer → (H, T, T) float32 attention weights (all heads), for the chosen layers.
        focus: per chosen layer and head, the keys the last token attends to most.
        resid_norms: (N,) L2 norm of blocks.i.resid_post at the last position.
        ffn_mean, ffn_std, ffn_positive: (N,) mean, std and fraction > 0 of blocks.i.ffn.act at
            the last position (over its F units; a mixture-of-experts block: of ffn.out).
        lens_ids, lens_probs: (N + 1, T) the logit lens's top token and its probability at every
            position: row 0 reads block 0's input, row i the output of block i − 1.
        logits: (V,) float32 logits at the last position; probs: softmax of them.
        top_ids: (k,) the most likely next tokens, most likely first.
        temperature_probs: temperature → (k,) probabilities of top_ids at that temperature.
        sampling: (label, explanation) for each of SAMPLING_SETTINGS.
        decoded: token id → its text, for every id above.
    """

    prompt: str
    tokens: list[int]
    text: list[str]
    n_layers: int
    n_heads: int
    position: str
    rope_theta: float
    embed_norms: Tensor
    pos_norms: Tensor | None
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    patterns: dict[int, Tensor]
    focus: tuple[HeadFocus, ...]
    resid_norms: Tensor
    ffn_mean: Tensor
    ffn_std: Tensor
    ffn_positive: Tensor
    lens_ids: Tensor
    lens_probs: Tensor
    logits: Tensor
    probs: Tensor
    top_ids: Tensor
    temperature_probs: dict[float, Tensor]
    sampling: tuple[tuple[str, SamplingExplanation], ...]
    decoded: dict[int, str]

    def text_of(self, token: int) -> str:
        """The text of a token id that appears anywhere in this explanation."""
        return self.decoded[token]


def default_layers(n_layers: int) -> tuple[int, ...]:
    """First, middle and last block (fewer when the model has fewer than three)."""
    return tuple(sorted({0, n_layers // 2, n_layers - 1}))


def check_choices(
    n_layers: int, n_heads: int, layer: int | None, head: int | None, top: int
) -> None:
    """Raise ClearLMError for a layer or head outside the model, or top < 1."""
    if layer is not None and not 0 <= layer < n_layers:
        raise ClearLMError(
            f"--layer {layer} is out of range: the model has {n_layers} layers (0–{n_layers - 1})"
        )
    if head is not None and not 0 <= head < n_heads:
        raise ClearLMError(
            f"--head {head} is out of range: the model has {n_heads} heads (0–{n_heads - 1})"
        )
    if top < 1:
        raise SamplingParamsError(f"--top must be at least 1, got {top}")


@torch.inference_mode()
def explain_data(
    model: Model,
    prompt: str | Sequence[int],
    layer: int | None = None,
    head: int | None = None,
    top: int = 10,
    attn_top: int = 3,
) -> Explanation:
    """Run `prompt` through `model` (a :class:`clearlm.api.model.Model`) once and collect every
    stage.

    Args:
        layer: the one block whose attention to show; None: first, middle and last.
        head: the one head to show; None: all.
        top: how many next tokens to list; attn_top: how many keys per head.

    Raises:
        ClearLMError: layer/head out of range; SamplingParamsError: top < 1;
        ContextLengthError: empty or too-long prompt.
    """
    cfg = model.config
    N, H = cfg.n_layers, cfg.n_heads
    check_choices(N, H, layer, head, top)
    layers = default_layers(N) if layer is None else (layer,)
    heads = tuple(range(H)) if head is None else (head,)
    names = ["embed", "logits", *lens_names(N)]
    if cfg.position != "rope":
        names.append("pos")
    points = model.transformer.hooks.points
    # a mixture-of-experts block has no single act (each expert has its own): its output
    ffn = [f"blocks.{i}.ffn.act" if f"blocks.{i}.ffn.act" in points else f"blocks.{i}.ffn.out"
           for i in range(N)]
    names += ffn
    names += [f"blocks.{i}.attn.pattern" for i in layers]
    tr = model.run_with_trace(prompt, names)

    embed_norms = tr["embed"][0].float().norm(dim=-1)  # (T, D) → (T,)
    pos_norms = tr["pos"].float().norm(dim=-1) if "pos" in tr else None  # (T, D) → (T,)

    patterns = {i: tr.pattern(i) for i in layers}  # (H, T, T) each
    focus = []
    for i in layers:
        for h in heads:
            row = patterns[i][h, -1]  # (T,) the last query's weights over the keys
            order = torch.sort(row, descending=True, stable=True).indices[:attn_top]
            focus.append(HeadFocus(i, h, tuple(order.tolist()), tuple(row[order].tolist())))

    last = torch.stack([tr[f"blocks.{i}.resid_post"][0, -1].float() for i in range(N)])  # (N, D)
    resid_norms = last.norm(dim=-1)  # (N,)
    acts = [tr[name][0, -1].float() for name in ffn]  # N × (F,), or (D,) for a mixture

    lens_probs, lens_ids = tr.logit_lens().max(dim=-1)  # (N + 1, T, V) → (N + 1, T) each

    logits = tr["logits"][0, -1].float()  # (V,)
    probs = softmax(logits)  # (V,)
    k = min(top, probs.numel())
    top_ids = torch.sort(probs, descending=True, stable=True).indices[:k]  # (k,)
    temperature_probs = {
        t: softmax(apply_temperature(logits, t))[top_ids] for t in TEMPERATURES
    }  # each (k,)
    history = torch.tensor(tr.tokens, dtype=torch.long)  # (T,)
    sampling = tuple(
        (label, explain_sampling(logits, history, params, top=k))
        for label, params in SAMPLING_SETTINGS
    )
    ids = set(tr.tokens) | set(top_ids.tolist()) | set(lens_ids.flatten().tolist())
    for _, why in sampling:
        ids |= {why.token} | {i for s in why.steps for i, _ in s.top}
    decoded = dict(zip(sorted(ids), token_pieces(model.tokenizer, sorted(ids)), strict=True))
    return _on_cpu(Explanation(
        prompt=prompt if isinstance(prompt, str) else model.tokenizer.decode(list(prompt)),
        tokens=list(tr.tokens),
        text=list(tr.text),
        n_layers=N,
        n_heads=H,
        position=cfg.position,
        rope_theta=float(cfg.rope_theta),
        embed_norms=embed_norms,
        pos_norms=pos_norms,
        layers=layers,
        heads=heads,
        patterns=patterns,
        focus=tuple(focus),
        resid_norms=resid_norms,
        ffn_mean=torch.stack([a.mean() for a in acts]),
        ffn_std=torch.stack([a.std() for a in acts]),
        ffn_positive=torch.stack([(a > 0).float().mean() for a in acts]),
        lens_ids=lens_ids,
        lens_probs=lens_probs,
        logits=logits,
        probs=probs,
        top_ids=top_ids,
        temperature_probs=temperature_probs,
        sampling=sampling,
        decoded=decoded,
    ))  # fmt: skip


def _on_cpu(ex: Explanation) -> Explanation:
    """The shown tensors brought to the CPU (a model on CUDA or MPS computes them there; the
    pictures and the text read them with .numpy() and .tolist())."""

    def cpu(v: object) -> object:
        if isinstance(v, Tensor):
            return v.cpu()
        return {k: cpu(x) for k, x in v.items()} if isinstance(v, dict) else v

    return replace(ex, **{f.name: cpu(getattr(ex, f.name)) for f in fields(ex)})


def show(text: str) -> str:
    """A token's text made visible: spaces as ␣, newlines and tabs escaped."""
    return text.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t") or "∅"
