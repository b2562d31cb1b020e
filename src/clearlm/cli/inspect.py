"""`clearlm info` and `clearlm perplexity`: look at a model and measure it."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clearlm.cli.app import DType, ModelOpt, Weights, app, err
from clearlm.cli.loader import QuietOpt, ThreadsOpt, load_model
from clearlm.cli.placement import DeviceOpt, Placement
from clearlm.text import read_text_file


@app.command()
def info(
    model: Annotated[
        str | None, typer.Argument(help="Path or alias (default smollm2-135m-instruct).")
    ] = None,
    model_opt: ModelOpt = None,
    weights: Weights = None,
) -> None:
    """Show a model's family, every hyper-parameter with its seed stage, tensors and tokenizer,
    and the weights a load holds in memory (--weights compact or float32).

    Reads only headers (GGUF metadata, config.json, safetensors headers): nothing is
    dequantized, so this is quick. The model is named as an argument or with -m, like elsewhere.
    """
    import re

    from clearlm.loading.checkpoint import open_checkpoint
    from clearlm.loading.held import HALF_HELD, WIDE_HELD
    from clearlm.store.catalog import resolve_model

    if model is not None and model_opt is not None and model != model_opt:
        raise typer.BadParameter(f"two models given: {model!r} and -m {model_opt!r}; give one")
    model = model if model is not None else model_opt
    path = resolve_model(model)
    ckpt = open_checkpoint(path)
    config, meta, tensors, tok = ckpt.config, ckpt.metadata, ckpt.tensors, ckpt.tokenizer
    size = ckpt.size_bytes
    out = Console(highlight=False)
    name = meta.get("general.name", path.name)
    out.print(
        f"[bold]{name}[/] · family {config.family or config.architecture}  {path}", soft_wrap=True
    )
    n_params = sum(t.n_elements for t in tensors)
    out.print(f"{n_params:,} parameters · {size / 2**20:.1f} MiB on disk", soft_wrap=True)
    mode, held, n_packed = ckpt.planned_weights(weights or "compact")
    if n_packed:
        why = f"{n_packed} matrices kept compact (block-quantized or 16-bit), the rest float32"
    elif weights == "float32":
        why = "every tensor dequantized (the reference path)"
    else:
        why = "no block-quantized matrix clearlm packs: every tensor float"
    out.print(f"weights {mode}: {held / 2**20:,.1f} MiB in memory · {why}", soft_wrap=True)
    if hasattr(ckpt, "weight_formats"):  # a GGUF: its types and how a load holds each
        wf = Table(title="Weights by GGUF type", title_justify="left")
        for col in ("type", "tensors", "file MiB", "memory MiB", "held as"):
            wf.add_column(col, justify="left" if col in ("type", "held as") else "right")
        for qtype, use in ckpt.weight_formats(weights or "compact"):
            wf.add_row(qtype, str(use.count), f"{use.file_bytes / 2**20:,.1f}",
                       f"{use.held_bytes / 2**20:,.1f}", held_as(use.held_as))
        out.print(wf)
        if any(use.held_as in ("packed", HALF_HELD, WIDE_HELD)
               for _, use in ckpt.weight_formats(weights or "compact")):
            out.print(products_line(), soft_wrap=True)

    hp = Table(title="Hyper-parameters by seed stage", title_justify="left")
    for col in ("stage", "name", "value"):
        hp.add_column(col)
    for stage, key, value in sorted(config.describe(), key=lambda r: r[0]):
        hp.add_row(stage, key, value)
    out.print(hp)

    kinds: dict[str, list] = {}
    for t in tensors:
        kinds.setdefault(re.sub(r"(^blk|layers|\.h)\.\d+\.", r"\1.*.", t.name), []).append(t)
    tt = Table(title="Tensors (shape: out × in)", title_justify="left")
    for col in ("tensor", "count", "type", "shape"):
        tt.add_column(col)
    for kind, ts in kinds.items():
        types = ", ".join(sorted({t.type for t in ts}))
        tt.add_row(kind, str(len(ts)), types, " × ".join(map(str, ts[0].shape)))
    out.print(tt)

    def show(i: int | None) -> str:
        return "-" if i is None else f"{i} {tok.id_to_token(i)!r}"

    tk = Table(title="Tokenizer", show_header=False, title_justify="left")
    tk.add_row("model", ckpt.tokenizer_kind)
    tk.add_row("vocabulary", f"{tok.vocab_size:,} tokens")
    tk.add_row("BOS / EOS", f"{show(tok.bos_id)} / {show(tok.eos_id)}")
    tk.add_row("end ids", ", ".join(show(i) for i in sorted(tok.eos_ids)) or "-")
    tk.add_row("adds BOS", str(tok.add_bos))
    tk.add_row("chat template", "yes" if tok.chat_template else "no")
    out.print(tk)

    from clearlm.sampling.defaults import describe

    gen = ckpt.generation_config
    gd = Table(title="Generation defaults (an option you pass wins)", title_justify="left")
    for col in ("setting", "generate", "chat", "source"):
        gd.add_column(col)
    for row in describe(gen):
        gd.add_row(*row)
    out.print(gd)
    if gen.ignored:
        out.print(f"{gen.path} also sets {', '.join(gen.ignored)}: clearlm does not apply these")


def held_as(how: str) -> str:
    """The "held as" column: for a packed type, what its products read (the file's codes and
    scales, repacked: quant/pack.py), else the loader's own words."""
    return "compact: codes + scales" if how == "packed" else how


def products_line() -> str:
    """Which code multiplies compact weights here, without building the kernel."""
    import os

    from clearlm.quant.kernels import NAME, build_dir

    if os.environ.get("CLEARLM_NO_KERNELS") == "1":
        return "compact products: pure torch (CLEARLM_NO_KERNELS=1), dequantizing bands of rows"
    built = (build_dir() / f"{NAME}.so").is_file()
    return ("compact products: the C++ kernel" + ("" if built else " (built at the first load, "
            "about a minute; pure torch where it cannot be)"))


@app.command()
def perplexity(
    text_file: Annotated[str, typer.Argument(help="A UTF-8 text file to score.")],
    model: ModelOpt = None,
    context: Annotated[
        int | None,
        typer.Option("--context", "-c", "--ctx-size", min=2,
                     help="Window length in tokens, >= 2 (default: the model's context)."),
    ] = None,
    stride: Annotated[
        int | None,
        typer.Option(min=1, help="Tokens between window starts, >= 1 (default: context / 2)."),
    ] = None,
    dtype: DType = "float32",
    weights: Weights = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    device: DeviceOpt = "cpu",
) -> None:
    """Perplexity of TEXT_FILE under the model, with a sliding window and a progress bar."""
    from rich.progress import Progress

    from clearlm.generation.perplexity import perplexity as compute

    # the file's exact characters: bytes decoded as UTF-8, no newline translation
    text = read_text_file(text_file, strict=True)
    m = load_model(model, dtype, threads, quiet, placement=Placement(device), weights=weights)
    ids = m.tokenizer.encode(text)
    with Progress(console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task("scoring windows", total=None)
        res = compute(
            m.transformer,
            ids,
            context,
            stride,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    print(f"perplexity {res.perplexity:.4f}")
    if quiet:
        return
    err.print(
        f"[dim]{res.n_predicted} tokens predicted in {res.n_windows} "
        f"window{'' if res.n_windows == 1 else 's'} · "
        f"mean NLL {res.mean_nll:.4f} nats/token[/]",
        soft_wrap=True,
    )
