"""``GET /v1/inspect/{id}``'s numbers: one served choice, recomputed by the served model.

One traced forward pass (:meth:`clearlm.api.model.Model.run_with_trace`) over the prompt and
the generated ids (all but the last, which conditions nothing) records every block's residual
stream; the logit lens (:meth:`clearlm.inspect.trace.Trace.logit_lens`) at the position before
each generated token gives each layer's top token there and the probability that layer gives
the generated token. Its last row is the final norm and output projection of the last block's
output, i.e. the model's own next-token distribution (softmax of the logits: temperature 1,
no sampling filter, no ``logit_bias``, no grammar: what the model thinks, not what the
request's settings drew from), hence the token's probability, its rank and the top
alternatives.

Token labels and top lists are those of the ``clearlm ui`` page
(:func:`clearlm.inspect.analysis.top_tokens`, :func:`~clearlm.inspect.analysis.label`), so
the page renders both the same way. The forward pass and the lens run in pieces the caller
can hold the engine's lock around (``locked``): no step of the batch engine runs meanwhile,
and between pieces it goes on.

Shape letters: P prompt tokens, G generated tokens, T = P + G - 1, N blocks, V vocab,
L lens rows shown (≤ N + 1), c positions in one lens piece.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from clearlm.api.model import Model
from clearlm.inspect.analysis import label, top_tokens
from clearlm.inspect.trace import Trace, lens_names
from clearlm.serve.errors import APIError
from clearlm.serve.inspect_store import Record

T = TypeVar("T")
Locked = Callable[[Callable[[], T]], T]
# Residual vectors one lens piece unembeds under the engine's lock: (N + 1) x c <= 64, so a
# piece stalls the batch about as long as a decode step of 64 rows' output projection
# (SmolLM2: 2 positions, ~1.8 GMAC; its probabilities 64 x V x 4 bytes: 12 MiB, 39 MiB at V 152k)
LENS_VECTORS = 64
MAX_TOP = 20


def lens_rows(n_layers: int) -> list[str]:
    """The logit lens's row names, as the page labels them: "embed", "block 0", ..."""
    return ["embed"] + [f"block {i}" for i in range(n_layers)]


def parse_layers(spec: str | None, n_layers: int) -> list[int]:
    """The lens rows a ``layers`` query asks for: None (all), or comma-separated items, each
    ``embed`` or a block index (negative counts from the end: -1 is the last block).

    Raises APIError (400, param ``layers``) naming the item that is not one."""
    if spec is None:
        return list(range(n_layers + 1))
    rows: list[int] = []
    for item in (s.strip() for s in spec.split(",")):
        if item == "embed":
            row = 0
        elif re.fullmatch(r"-?[0-9]{1,6}", item) and -n_layers <= int(item) < n_layers:
            row = int(item) % n_layers + 1
        else:
            raise APIError(400, f"layers: {item!r} is not 'embed' or a block index in "
                           f"[-{n_layers}, {n_layers}) (comma-separated)", "layers",
                           "invalid_value")  # fmt: skip
        if row not in rows:
            rows.append(row)
    return sorted(rows)


def choice_ids(record: Record, choice: int) -> tuple[list[int], list[int]]:
    """The prompt's and the generated ids of ``choice``. Raises APIError (400, ``choice``)."""
    if not 0 <= choice < len(record.choices):
        raise APIError(400, f"choice {choice} is out of range: this completion has "
                       f"{len(record.choices)} choice(s)", "choice", "invalid_value")  # fmt: skip
    prompt_index, generated = record.choices[choice]
    return list(record.prompts[prompt_index]), list(generated)


def inspect_choice(
    model: Model,
    record: Record,
    choice: int = 0,
    top: int = 5,
    layers: list[int] | None = None,
    locked: Locked[Any] = lambda fn: fn(),
) -> dict[str, Any]:
    """Per generated token of ``choice``: its text, id, probability and rank, the ``top``
    alternatives and the logit lens at ``layers`` (rows of :func:`lens_rows`; None: all).

    Returns a JSON-ready dict: ``prompt`` (text), ``prompt_tokens`` ([{id, label}]),
    ``text`` (the generated ids decoded), ``layers`` (row names), and ``tokens``: per token
    ``{index, position, id, label, p, rank, top: [{id, label, p}], lens: [{layer, top:
    [{id, label, p}], p_token}]}`` (``p_token``: the probability that row gives the token).

    Raises:
        APIError: 400 for a choice out of range.
    """
    prompt, generated = choice_ids(record, choice)
    n = model.config.n_layers
    rows = list(range(n + 1)) if layers is None else layers
    names = lens_rows(n)
    out: dict[str, Any] = {
        "choice": choice,
        "prompt": model.tokenizer.decode(prompt),
        "prompt_tokens": [{"id": i, "label": label(model, i)} for i in prompt],
        "text": model.tokenizer.decode(generated),
        "layers": [names[r] for r in rows],
        "tokens": [],
    }
    if not generated:  # max_tokens 0, or aborted before its first token
        return out
    P = len(prompt)
    ids = prompt + generated[:-1]  # (T,): the last token conditions nothing
    trace = locked(lambda: model.run_with_trace(ids, lens_names(n)))
    for a, dist, lens in lens_pieces(model, trace, P - 1, len(generated), locked):
        # dist (c, V): the lens's last row, the model's own distribution; lens (N + 1, c, V)
        gen = torch.tensor(generated[a : a + len(dist)])  # (c,)
        chosen = dist.gather(1, gen[:, None])[:, 0]  # (c,)
        ranks = (dist > chosen[:, None]).sum(dim=1) + 1  # (c,) 1: the most likely
        shown = lens[torch.tensor(rows, device=lens.device)]  # (L, c, V)
        top_p, top_id = (x.T.cpu() for x in shown.max(dim=-1))  # (c, L) each
        at = gen.to(shown.device).expand(len(rows), -1)[..., None]  # (L, c, 1)
        tok_p = shown.gather(2, at)[..., 0].T.cpu()  # (c, L)
        for j, token in enumerate(gen.tolist()):
            out["tokens"].append({
                "index": a + j,
                "position": P + a + j,
                "id": token,
                "label": label(model, token),
                "p": float(chosen[j]),
                "rank": int(ranks[j]),
                "top": top_tokens(model, dist[j], top),
                "lens": [
                    {"layer": names[r], "p_token": float(tok_p[j, m]),
                     "top": [{"id": int(top_id[j, m]), "label": label(model, int(top_id[j, m])),
                              "p": float(top_p[j, m])}]}  # fmt: skip
                    for m, r in enumerate(rows)
                ],
            })  # fmt: skip
    return out


def lens_pieces(
    model: Model, trace: Trace, start: int, count: int, locked: Locked[Any]
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """The logit lens at positions ``start`` … ``start + count - 1``, c positions at a time (a
    :class:`Trace` of the same pass cut to those positions, so the lens is the trace's own),
    each piece computed under ``locked`` (so the engine steps between pieces).

    Yields (a, dist, lens): the first position's offset from ``start``; the lens's last row
    (the model's own next-token distribution) on the CPU, (c, V) float32; the whole lens on
    the model's device, (N + 1, c, V) float32."""
    n = model.config.n_layers
    step = max(1, LENS_VECTORS // (n + 1))
    names = lens_names(n)
    for a in range(0, count, step):
        b = min(count, a + step)
        cut = {name: trace[name][:, start + a : start + b] for name in names}  # (1, c, D) each
        piece = Trace(cut, trace.tokens, trace.text, model.transformer.unembed)
        lens = locked(piece.logit_lens)  # (N + 1, c, V)
        yield a, lens[-1].cpu(), lens


def check_top(top: int) -> None:
    """Raise APIError (400, ``top``) unless 1 ≤ top ≤ MAX_TOP."""
    if not 1 <= top <= MAX_TOP:
        raise APIError(400, f"top must be in [1, {MAX_TOP}], got {top}", "top", "invalid_value")
