"""`clearlm explain PROMPT`: one prompt through a real model, every stage as a table.

The numbers come from :func:`clearlm.inspect.explain.explain_data`; the tables from
:func:`clearlm.inspect.report.sections` (shared with the ``--html`` page); the pictures from
:mod:`clearlm.inspect.plots`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clearlm.cli.app import DType, ModelOpt, Weights, app, err
from clearlm.cli.loader import QuietOpt, ThreadsOpt, load_model
from clearlm.cli.placement import DeviceOpt, Placement
from clearlm.errors import ClearLMError


@app.command()
def explain(
    prompt: Annotated[str, typer.Argument(help="The text to run through the model.")],
    model: ModelOpt = None,
    layer: Annotated[
        int | None,
        typer.Option(help="Show attention of this block only (default first, middle, last)."),
    ] = None,
    head: Annotated[int | None, typer.Option(help="Show this attention head only.")] = None,
    top: Annotated[int, typer.Option(min=1, help="How many next tokens to list.")] = 10,
    png: Annotated[
        Path | None, typer.Option(help="Write attention, logit-lens and temperature PNGs here.")
    ] = None,
    html: Annotated[
        Path | None, typer.Option(help="Write one self-contained HTML page with it all.")
    ] = None,
    dtype: DType = "float32",
    weights: Weights = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Show every stage for PROMPT: tokens and embeddings, where the last token attends,
    residual-stream norms and FFN statistics, the logit lens, the next-token probabilities and
    what greedy, temperature, top-k and top-p would pick."""
    from clearlm.inspect.explain import explain_data
    from clearlm.inspect.report import html_page, sections
    from clearlm.text import clean_arg

    # Check the output places before the (slow) model load and computation.
    for folder in [png] if png is not None else []:
        _writable(folder)
    if html is not None:
        _writable(html.parent)
    from clearlm.inspect.explain import check_choices

    # --layer / --head are checked on the model's header, before the weights are read.
    m = load_model(
        model, dtype, threads, quiet,
        check=lambda h: check_choices(h.config.n_layers, h.config.n_heads, layer, head, top),
        placement=Placement(device),
        weights=weights,
    )  # fmt: skip
    ex = explain_data(m, clean_arg(prompt), layer, head, top)  # bad bytes → U+FFFD

    out = Console(highlight=False)
    stage = None
    for s in sections(ex):
        if s.stage != stage:
            out.rule(f"[bold]{s.stage}")
            stage = s.stage
        t = Table(title=s.title, title_justify="left", caption=s.note, caption_justify="left")
        for c in s.columns:
            t.add_column(c)
        for row in s.rows:
            t.add_row(*row)
        out.print(t)

    if png is None and html is None:
        return
    from clearlm.inspect.plots import all_pngs

    pngs = all_pngs(ex)
    try:
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            for name, data in pngs.items():
                (png / name).write_bytes(data)
            err.print(f"wrote {', '.join(str(png / n) for n in pngs)}", soft_wrap=True)
        if html is not None:
            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(html_page(ex, pngs), encoding="utf-8")
            err.print(f"wrote {html}", soft_wrap=True)
    except OSError as e:
        raise ClearLMError(f"cannot write {e.filename}: {e.strerror}") from None


def _writable(folder: Path) -> None:
    """Create `folder` if needed; ClearLMError (one line) if it cannot be written."""
    import os

    from clearlm.errors import ClearLMError

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ClearLMError(f"cannot write {folder}: {e.strerror}") from None
    if not os.access(folder, os.W_OK):
        raise ClearLMError(f"cannot write {folder}: permission denied")
