"""`clearlm patch`: activation patching of a clean/corrupted pair of prompts, as a table, JSON or
a heat map (:meth:`clearlm.api.model.Model.patch`, :mod:`clearlm.inspect.patching`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from clearlm.cli.app import DType, ModelOpt, Weights, app, err
from clearlm.cli.loader import QuietOpt, ThreadsOpt, load_model, model_label
from clearlm.cli.placement import DeviceOpt, Placement
from clearlm.errors import ClearLMError


def _positions(value: str | None) -> list[int] | None:
    """``--positions 1,2,-1`` → [1, 2, -1]; None stays None (every position)."""
    if value is None:
        return None
    try:
        return [int(p) for p in value.split(",") if p.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a list of positions such as 1,2,-1", param_hint="--positions"
        ) from None


@app.command()
def patch(
    clean: Annotated[str, typer.Option(help="The prompt the model answers right.")],
    corrupted: Annotated[
        str, typer.Option(help="The same prompt with a few tokens changed (same token count).")
    ],
    answer: Annotated[str, typer.Option(help="The clean answer, one token (' Paris').")],
    wrong: Annotated[str, typer.Option(help="The corrupted answer, one token (' Rome').")],
    points: Annotated[
        str,
        typer.Option(
            help="Hook points, comma-separated: kinds patched in every block (resid_pre, "
            "attn.out, ffn.out, resid_mid, resid_post, attn.z, ...) or names "
            "(blocks.3.attn.out, embed)."
        ),
    ] = "resid_pre",
    positions: Annotated[
        str | None,
        typer.Option(help="Token positions, comma-separated (-1: the last); default all."),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, help="Patched runs per forward pass (memory vs speed).")
    ] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="Print the grid as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write the grid as a heat map PNG.")] = None,
    model: ModelOpt = None,
    dtype: DType = "float32",
    weights: Weights = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Activation patching: run the corrupted prompt again with one activation (a hook point at
    one position) taken from the clean run, for every point and position, and print how much
    of logit[answer] − logit[wrong] each brings back: (patched − corrupted) / (clean −
    corrupted), 1 = all of it, 0 = none (Wang et al. 2022; Heimersheim & Nanda 2024)."""
    from clearlm.text import clean_arg

    clean, corrupted = clean_arg(clean), clean_arg(corrupted)  # bad bytes → U+FFFD
    answer, wrong = clean_arg(answer), clean_arg(wrong)
    names = [p.strip() for p in points.split(",") if p.strip()]
    where = _positions(positions)
    if plot is not None:
        _writable(plot)
    # Every argument is checked on the model's header (tokenizer, config), before the weights.
    m = load_model(
        model, dtype, threads, quiet,
        check=lambda h: h.patch_inputs(clean, corrupted, names, where, answer, wrong,
                                        token_ids=False),
        placement=Placement(device),
        weights=weights,
    )  # fmt: skip
    r = m.patch(clean, corrupted, names, where, answer=answer, wrong=wrong, batch_size=batch_size)
    if as_json:
        print(json.dumps({"model": model_label(model), **r.to_dict()}, ensure_ascii=False))
    else:
        print(r.table())
    if plot is not None:
        from clearlm.inspect.patch_plot import recovery_png

        png, _ = recovery_png(r)
        try:
            plot.write_bytes(png)
        except OSError as e:
            raise ClearLMError(f"cannot write {plot}: {e.strerror}") from None
        err.print(f"wrote {plot}", soft_wrap=True)


def _writable(file: Path) -> None:
    """ClearLMError (one line) unless ``file`` can be written: its folder is created if needed."""
    if not file.is_dir() and file.suffix.lower() != ".png":  # never a model file overwritten
        raise ClearLMError(
            f"--plot writes a PNG: give a file name ending in .png, not {file.name}"
        )
    import os

    try:
        file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ClearLMError(f"cannot write {file}: {e.strerror}") from None
    if file.is_dir() or not os.access(file.parent, os.W_OK):
        raise ClearLMError(f"cannot write {file}: not a writable file path")
