"""An :class:`~clearlm.inspect.explain.Explanation` as tables of strings, and as one HTML page.

:func:`sections` is shared by the terminal (rich tables, cli/explain.py) and the page, so both
show the same rows. :func:`html_page` is self-contained: inline CSS, pictures as base64 PNGs,
no external resource.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass

from clearlm.inspect.explain import Explanation, show


@dataclass(frozen=True)
class Section:
    """One table: a stage heading, a note under it, column names and rows of strings."""

    stage: str
    title: str
    note: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def _tok(ex: Explanation, i: int) -> str:
    return show(ex.text_of(i))


def sections(ex: Explanation) -> list[Section]:
    """The five stages as tables (stage 2 has two: attention, then residual norms and FFN)."""
    T = len(ex.tokens)
    out = [
        Section(
            "Stage 1 · input",
            "tokens and embeddings",
            "‖embedding‖ is the L2 norm of each token's embedding vector. "
            + (
                f"Positions: RoPE (θ = {ex.rope_theta:g}) rotates q and k inside attention; "
                "nothing is added to the embeddings."
                if ex.pos_norms is None
                else f"Positions: {ex.position}, added to the embeddings (‖position‖)."
            ),
            ("position", "token", "id", "‖embedding‖")
            + (() if ex.pos_norms is None else ("‖position‖",)),
            tuple(
                (str(p), show(ex.text[p]), str(ex.tokens[p]), f"{float(ex.embed_norms[p]):.3f}")
                + (() if ex.pos_norms is None else (f"{float(ex.pos_norms[p]):.3f}",))
                for p in range(T)
            ),
        ),
        Section(
            "Stage 2 · attention",
            "where the last token looks",
            f"Query: the last token {show(ex.text[-1])!s} (position {T - 1}). Keys with the "
            "largest attention weight per head, weight in parentheses.",
            ("layer", "head", "attends most to"),
            tuple(
                (
                    str(f.layer),
                    str(f.head),
                    ", ".join(
                        f"{show(ex.text[p])}@{p} ({w:.2f})"
                        for p, w in zip(f.positions, f.weights, strict=True)
                    ),
                )
                for f in ex.focus
            ),
        ),
        Section(
            "Stage 3 · residual stream + FFN",
            "per block, at the last position",
            "‖resid‖: L2 norm of the residual stream leaving the block. FFN: mean, std and "
            "fraction > 0 of ffn.act (what enters down_proj) at the last position, over its units.",
            ("block", "‖resid‖", "FFN mean", "FFN std", "FFN > 0"),
            tuple(
                (
                    str(i),
                    f"{float(ex.resid_norms[i]):.2f}",
                    f"{float(ex.ffn_mean[i]):+.4f}",
                    f"{float(ex.ffn_std[i]):.4f}",
                    f"{float(ex.ffn_positive[i]):.1%}",
                )
                for i in range(ex.n_layers)
            ),
        ),
        Section(
            "Stage 4 · logit lens",
            "each block's output read as if it were the last",
            "Final norm + output projection applied to the residual stream at the last position; "
            "'emb' is block 0's input. The last row is the model's own prediction.",
            ("after", "top token", "P"),
            tuple(
                (
                    "emb" if i == 0 else f"block {i - 1}",
                    _tok(ex, int(ex.lens_ids[i, -1])),
                    f"{float(ex.lens_probs[i, -1]):.3f}",
                )
                for i in range(ex.n_layers + 1)
            ),
        ),
        Section(
            "Stage 5 · output and sampling",
            "top logits → softmax probabilities",
            "P = softmax(logits) at the last position; T columns: softmax(logits / T).",
            ("rank", "token", "id", "logit", "P")
            + tuple(f"P (T={t:g})" for t in ex.temperature_probs if t != 1.0),
            tuple(
                (
                    str(r + 1),
                    _tok(ex, i),
                    str(i),
                    f"{float(ex.logits[i]):.3f}",
                    f"{float(ex.probs[i]):.4f}",
                )
                + tuple(f"{float(p[r]):.4f}" for t, p in ex.temperature_probs.items() if t != 1.0)
                for r, i in enumerate(ex.top_ids.tolist())
            ),
        ),
        Section(
            "Stage 5 · output and sampling",
            "what each strategy would pick",
            "Chain: repetition penalty → temperature → top-k → top-p → min-p, then argmax "
            "(greedy) or a draw seeded with 0. 'kept' counts the tokens left to draw from.",
            ("strategy", "kept", "most likely kept", "pick", "P(pick)"),
            tuple(
                (
                    label,
                    f"{len(why.steps[-1].kept):,}",
                    ", ".join(f"{_tok(ex, i)} {p:.2f}" for i, p in why.steps[-1].top[:3]),
                    _tok(ex, why.token),
                    f"{why.probability:.4g}",
                )
                for label, why in ex.sampling
            ),
        ),
    ]
    return out


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .2em .6em; text-align: left; }
th { background: #f3f3f3; } td { font-family: ui-monospace, monospace; }
p.note { color: #555; font-size: .9em; } img { max-width: 100%; border: 1px solid #eee; }
"""

FIGURES = {
    "Stage 2 · attention": ("attention.png", "Attention weights of the chosen layers and heads"),
    "Stage 4 · logit lens": ("logit_lens.png", "Logit lens at every layer and position"),
    "Stage 5 · output and sampling": (
        "temperature.png",
        "Next-token probabilities at several temperatures",
    ),
}


def html_page(ex: Explanation, pngs: dict[str, bytes]) -> str:
    """One self-contained HTML page: every section's table, each picture after its stage."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>clearlm explain: {e(ex.prompt)}</title><style>{CSS}</style></head><body>",
        f"<h1>clearlm explain: <code>{e(ex.prompt)}</code></h1>",
        f"<p>{len(ex.tokens)} tokens, {ex.n_layers} blocks, {ex.n_heads} heads.</p>",
    ]
    placed: set[str] = set()
    for s in sections(ex):
        parts.append(f"<h2>{e(s.stage)}: {e(s.title)}</h2><p class='note'>{e(s.note)}</p>")
        parts.append("<table><tr>" + "".join(f"<th>{e(c)}</th>" for c in s.columns) + "</tr>")
        for row in s.rows:
            parts.append("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>")
        parts.append("</table>")
        name, alt = FIGURES.get(s.stage, (None, ""))
        if name in pngs and name not in placed:  # after the first table of its stage
            placed.add(name)
            data = base64.b64encode(pngs[name]).decode("ascii")
            parts.append(f'<img alt="{e(alt)}" src="data:image/png;base64,{data}">')
    parts.append("</body></html>")
    return "\n".join(parts)
