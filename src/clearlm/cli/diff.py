"""`clearlm diff A B PROMPT`: where model B drifts from model A, layer by layer, on one text.

The numbers are :func:`clearlm.api.diff.diff`'s (:mod:`clearlm.inspect.diff`), the picture
:func:`clearlm.inspect.diff_plot.diff_png`'s. ``--weights`` and ``--dtype`` take one value for
both models or are given twice, A's then B's: ``clearlm diff M M "text" --weights float32
--weights compact`` compares one file's two weight modes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from clearlm.cli.app import DTYPE_NAMES, WEIGHT_NAMES, app, err
from clearlm.cli.loader import QuietOpt, ThreadsOpt, load_model, model_label
from clearlm.cli.prompt_input import resolve_prompt
from clearlm.errors import ClearLMError

if TYPE_CHECKING:
    import torch

    from clearlm.inspect.diff import ModelDiff

DEFAULT_THRESHOLD = 0.01  # clearlm.inspect.diff.DEFAULT_THRESHOLD (a test holds them equal)


def _sides(values: list[str] | None, names: tuple[str, ...], option: str,
           default: str | None) -> tuple[str | None, str | None]:
    """One value for both models, or A's then B's; a usage error (exit 2) otherwise."""
    values = values or [default]
    if len(values) > 2:
        raise typer.BadParameter(f"give {option} once (both models) or twice (A, then B), "
                                 f"not {len(values)} times", param_hint=f"'{option}'")
    for v in values:
        if v is not None and v not in names:
            raise typer.BadParameter(f"{v!r} is not one of {', '.join(names)}",
                                     param_hint=f"'{option}'")
    return values[0], values[-1]


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="The reference: a .gguf file, a Hugging Face folder "
                                     "or an alias.", show_default=False)],
    b: Annotated[str, typer.Argument(help="The model compared with A.", show_default=False)],
    prompt: Annotated[str | None, typer.Argument(
        metavar="PROMPT", show_default=False,
        help="The text both run ('-': standard input).")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read the text from FILE.")
                    ] = None,
    threshold: Annotated[
        float, typer.Option(min=0.0, help="Relative error of the residual stream (resid_post) "
                            "above which a block is the first that drifted.")
    ] = DEFAULT_THRESHOLD,
    weights: Annotated[list[str] | None, typer.Option(
        help="compact or float32, for both models, or twice: A's, then B's.")] = None,
    dtype: Annotated[list[str] | None, typer.Option(
        help="float32, bfloat16 or float16, for both, or twice: A's, then B's.")] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Write a PNG: layer × position heat map, KL per position, errors per layer.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Compare model B with model A on the same tokens, stage by stage: the relative error
    ‖a − b‖/‖a‖ of the embeddings, each block's attn.out, resid_mid, ffn.out and resid_post,
    and the final norm, per position; the first block whose residual stream differs by more than
    --threshold; the logits' KL divergence, top-1 agreement and both perplexities of the text.
    For two quantizations of one model, a GGUF and its HF folder, compact against float32
    weights, one model at two dtypes. Models with another vocabulary, tokenization or shape are
    refused (exit 2)."""
    text = resolve_prompt(prompt, file, "PROMPT")
    if not text:  # None: not given; "": nothing to run (refused before the loads)
        raise typer.BadParameter(
            "the text to compare on is empty" if text == "" else
            "give the text to compare on: PROMPT, '-' or -f FILE", param_hint="'PROMPT'")
    weights_ab = _sides(weights, WEIGHT_NAMES, "--weights", None)
    dtypes = _sides(dtype, DTYPE_NAMES, "--dtype", "float32")
    if plot is not None:  # before the slow loads
        _check_writable(plot)
    from clearlm.api.diff import diff as run_diff  # torch: after the usage errors (~3 s)
    from clearlm.inspect.diff import check_comparable
    model_a = load_model(a, dtypes[0], threads, quiet, weights=weights_ab[0])
    ids = model_a.encode(text)

    def comparable(header: Any) -> None:  # B's header, before its weights are read
        check_comparable(model_a.config, header.config, ids, header.encode(text))

    model_b = load_model(b, dtypes[1], threads, quiet, check=comparable, weights=weights_ab[1])
    loaded = [model_a, model_b]
    result = run_diff(model_a, model_b, text, threshold)
    labels = [model_label(a), model_label(b)]
    if plot is not None:
        from clearlm.inspect.diff_plot import diff_png

        names = [Path(label).name for label in labels]  # a path's folder adds nothing here
        png, _ = diff_png(result, f"{names[1]} against {names[0]}: the residual stream's "
                          "relative error")
        try:
            plot.write_bytes(png)
        except OSError as e:
            raise ClearLMError(f"cannot write {plot}: {e.strerror}") from None
        if not quiet:
            err.print(f"wrote {plot}", soft_wrap=True)
    if as_json:
        print(json.dumps({"model_a": labels[0], "model_b": labels[1],
                          "weights": [m.weights for m in loaded],
                          "dtype": list(dtypes), **result.to_dict()}))
        return
    show_table(result, labels)


def _check_writable(path: Path) -> None:
    """The plot's folder exists and can be written, and the path is not a folder itself
    (ClearLMError, one line, if not)."""
    if not path.is_dir() and path.suffix.lower() != ".png":  # never a model file overwritten
        raise ClearLMError(
            f"--plot writes a PNG: give a file name ending in .png, not {path.name}"
        )
    import os

    if path.is_dir():
        raise ClearLMError(f"cannot write {path}: it is a folder; give a file name such as "
                           f"{path / 'diff.png'}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ClearLMError(f"cannot write {path}: no such folder, or not writable")


def _e(x: float) -> str:
    """A short number for the table: 1.7e-3, 0, inf."""
    if x == 0 or x != x or x in (float("inf"), float("-inf")):
        return f"{x:g}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _cell(err_t: torch.Tensor) -> str:
    """max / mean of a (T,) error."""
    return f"{_e(float(err_t.max()))} / {_e(float(err_t.mean()))}"


def show_table(d: ModelDiff, labels: list[str]) -> None:
    """The per-layer table (max / mean relative error of each point) and the summary lines."""
    out = Console(highlight=False)
    first = d.first_layer
    t = Table(title=f"{labels[1]} against {labels[0]} · {len(d.tokens)} tokens · relative error "
              "‖a − b‖/‖a‖, max / mean over positions", title_justify="left",
              caption="emb: the embeddings (block 0's input); norm: the final norm's output",
              caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False)
    t.add_column("block", justify="right")
    for p in d.points:
        t.add_column(p, justify="right")
    t.add_row("emb", _cell(d.embed), "", "", "")
    for i in range(d.n_layers):
        over = bool((d.point("resid_post")[i] > d.threshold).any())
        style = "bold red" if i == first else ("yellow" if over else None)
        t.add_row(str(i), *(_cell(d.blocks[i, j]) for j in range(len(d.points))), style=style)
    t.add_row("norm", "", "", "", _cell(d.final_norm))
    out.print(t)
    where = (f"block {first}" if first is not None else "none")
    out.print(f"first layer over {d.threshold:g} (resid_post): [bold]{where}[/]", soft_wrap=True)
    g = d.logits
    n_agree = int(d.top1.sum())
    out.print(f"logits: mean KL {g.mean_kl:.3e} nats · max KL {g.max_kl:.3e} · top-1 agreement "
              f"{g.top1_agreement:.1%} ({n_agree}/{g.n_positions}) · max |Δlogit| "
              f"{g.max_abs_logit:.3g}", soft_wrap=True)
    pa, pb = d.perplexity_a, d.perplexity_b
    if pa is not None and pb is not None:
        out.print(f"perplexity of the text: A {pa:.4f} · B {pb:.4f} · B − A {pb - pa:+.4f}",
                  soft_wrap=True)
