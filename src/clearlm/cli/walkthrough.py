"""`clearlm walkthrough`: the seeds' worked examples, stage by stage, computed by the real code.

The numbers come from :mod:`clearlm.inspect.walkthrough` (which runs ``clearlm.model`` and
``clearlm.sampling.chain``); this module only lays them out as the source documents do
(``../shared/seeds/``), with rich tables, and notes where the documents' arithmetic is off.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from clearlm.cli.app import app


def _f(x: float, places: int = 6) -> str:
    return f"{x:.{places}f}"


def _vec(xs: Sequence[float], places: int = 3) -> str:
    return "[" + ", ".join(_f(x, places) for x in xs) + "]"


def _n(x: float) -> str:
    """A factor as the document writes it: negatives in parentheses."""
    return f"({x:g})" if x < 0 else f"{x:g}"


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title or None, title_justify="left")
    for c in columns:
        t.add_column(c)
    return t


@app.command()
def walkthrough() -> None:
    """Run the seed documents' worked examples through clearlm's own layers and print each step.

    Stage 1 sinusoidal positions, stage 2 the causal mask and two heads concatenated, stage 3
    LayerNorm and ReLU, stage 4 the output projection, stage 5 softmax, greedy, and what
    temperature, top-k and top-p do to that distribution. Needs no model file.
    """
    from clearlm.inspect import walkthrough as wt

    out = Console(highlight=False)

    out.rule("[bold]Stage 1 · input representation: sinusoidal position encoding")
    out.print("PE(p, 2i) = sin(p / 10000^(2i/d)),  PE(p, 2i+1) = cos(p / 10000^(2i/d)),  d = 4")
    t = _table("", "position p", "PE(p, 0)", "PE(p, 1)", "PE(p, 2)", "PE(p, 3)")
    for p, row in enumerate(wt.sinusoidal_rows(4, 4)):
        t.add_row(str(p), *(_f(v) for v in row))
    out.print(t)
    out.print("H0 = Embedding(token) + PositionEncoding(index)\n")

    out.rule("[bold]Stage 2 · multi-head self-attention")
    out.print("Causal mask for 4 tokens: query t may attend to key s only when s ≤ t.")
    t = _table("", "query \\ key", *(f"s={s}" for s in range(4)))
    for q, row in enumerate(wt.causal_mask(4)):
        t.add_row(f"t={q}", *("✓" if ok else "·" for ok in row))
    out.print(t)
    heads = wt.heads_example()
    out.print("Example 1: two heads of width 2, concatenated back to d_model = 4 (before o_proj):")
    t = _table("", "head 0", "head 1", "concatenation")
    t.add_row(_vec(heads.heads[0]), _vec(heads.heads[1]), _vec(heads.concat))
    out.print(t)
    out.print()

    out.rule("[bold]Stage 3 · residual + LayerNorm + FFN")
    ln = wt.layernorm_example()
    out.print(f"Example 2: LayerNorm of z = {_vec(ln.z)}, γ = 1, β = 0, ε = {ln.eps:g}")
    out.print(f"  μ  = mean(z) = {ln.mean:.5f}")
    out.print(
        f"  σ² = mean((z − μ)²) = {ln.variance:.8f}   (population variance; the document "
        f"prints {ln.document_variance}, having rounded each square to 4 places)"
    )
    out.print(
        f"  √(σ² + ε) = {ln.std:.7f}   (the document divides by {ln.document_std}, "
        "√0.27925, leaving out ε)"
    )
    t = _table("LN(z) = γ·(z − μ)/√(σ² + ε) + β", "i", "z", "LN(z)", "document")
    for i, (z, y, d) in enumerate(zip(ln.z, ln.output, ln.document_output, strict=True)):
        t.add_row(str(i), _f(z, 3), _f(y), str(d))
    out.print(t)
    out.print(
        "LN(z) is clearlm's LayerNorm, which computes in float32 as transformers does: the 6th "
        "decimal can differ by 1 from float64 (1.717696)."
    )
    relu = wt.relu_example()
    out.print("Example 3: FFN(z) = W2·ReLU(W1·z + b1) + b2; ReLU sets negatives to 0 (d_ff = 8)")
    t = _table("", "W1·z + b1", "ReLU")
    for x, y in zip(relu.hidden, relu.relu, strict=True):
        t.add_row(_f(x, 2), _f(y, 2))
    out.print(t)
    out.print()

    out.rule("[bold]Stage 4 · output projection: logits = h · W")
    ex = wt.output_example()
    out.print(f"Example 4: h = {_vec(ex.h, 2)}, one column of W (4 × 5) per word")
    t = _table("", "word", "h · W[:, j]", "logit", "document")
    for j, word in enumerate(ex.words):
        terms = " + ".join(f"{_n(h)}×{_n(row[j])}" for h, row in zip(ex.h, ex.W, strict=True))
        t.add_row(word, terms, _f(ex.logits[j], 3), _f(ex.document_logits[j], 3))
    out.print(t)
    out.print("The document's logits are slightly off; the right ones are computed above.\n")

    out.rule("[bold]Stage 5 · softmax and sampling")
    t = _table("P_i = e^{z_i} / Σ_j e^{z_j}", "word", "P (right logits)", "P (document's)")
    for j, word in enumerate(ex.words):
        t.add_row(word, _f(ex.probs[j]), _f(ex.document_probs[j]))
    out.print(t)
    out.print(
        f"Greedy (argmax): [bold]{ex.greedy_word}[/] "
        f"(P = {_f(ex.probs[ex.greedy_id])}); the document's logits pick "
        f"{ex.words[ex.document_greedy_id]} too."
    )
    scenarios = wt.sampling_scenarios(ex.logits)
    t = _table("What each strategy leaves to draw from (renormalised; – removed)", "strategy")
    for word in ex.words:
        t.add_column(word, justify="right")
    for sc in scenarios:
        kept = sc.draw_probs()  # id -> probability of being picked
        t.add_row(sc.label, *(f"{kept[i]:.4f}" if i in kept else "–" for i in range(len(ex.words))))
    out.print(t)
    out.print("Picks of samplers seeded 0–9 (greedy is always the argmax):")
    for sc in scenarios:
        out.print(f"  {sc.label:<16} " + " ".join(ex.words[i] for i in sc.draws))
    out.print(
        "Temperature divides the logits before softmax (T < 1 sharpens, T > 1 flattens); "
        "top-k keeps the k most likely words; top-p keeps the smallest set whose probability "
        "reaches p. The chain runs repetition penalty → temperature → top-k → top-p → min-p "
        "(Hugging Face's order). Then the chosen word is appended and the model runs again."
    )
