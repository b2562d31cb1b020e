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
Temp = Annotated[float, typer.Option(help="Divide logits by this before softmax; 0 = greedy.")]
TopK = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off.")]
TopP = Annotated[
    float,
    typer.Option("--top-p", help="Keep the smallest set with this much probability; 1 = off."),
]
MinP = Annotated[
    float, typer.Option("--min-p", help="Drop tokens below min_p × the top probability; 0 = off.")
]
RepPen = Annotated[
    float, typer.Option("--repetition-penalty", help="CTRL penalty on seen tokens; 1 = off.")
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


def _run(
    model_name: str | None, dtype: str, build_prompt, max_new_tokens: int, stop, sampling: dict
) -> None:
    from clearlm.api import load
    from clearlm.sampling import SamplingParams

    params = SamplingParams(**sampling)  # validate before the (slow) model load
    model = load(model_name, _dtype(dtype))
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
    temperature: Temp = 0.8,
    top_k: TopK = 0,
    top_p: TopP = 1.0,
    min_p: MinP = 0.0,
    repetition_penalty: RepPen = 1.0,
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
    _run(model, dtype, lambda m: m.encode(prompt), max_new_tokens, stop, sampling)


@app.command()
def chat(
    message: Annotated[str, typer.Argument(help="The user's message.")],
    system: Annotated[str | None, typer.Option(help="A system message to put first.")] = None,
    model: ModelOpt = None,
    max_new_tokens: MaxNew = 256,
    temperature: Temp = 0.0,
    top_k: TopK = 0,
    top_p: TopP = 1.0,
    min_p: MinP = 0.0,
    repetition_penalty: RepPen = 1.0,
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
    _run(model, dtype, lambda m: m.chat_prompt(messages), max_new_tokens, stop, sampling)


@app.command()
def info(
    model: Annotated[
        str | None, typer.Argument(help="Path or alias (default smollm2-135m-instruct).")
    ] = None,
) -> None:
    """Show a model's architecture, hyper-parameters, tensor types and tokenizer.

    Reads only the file's header: nothing is dequantized, so this is quick.
    """
    import os
    import re

    from clearlm.loading.load import inspect_gguf
    from clearlm.models import resolve_model
    from clearlm.tokenizer import Tokenizer

    path = resolve_model(model)
    config, meta, tensors = inspect_gguf(path)
    tok = Tokenizer.from_gguf_metadata(meta, source=path.name)
    out = Console(highlight=False)
    out.print(f"[bold]{meta.get('general.name', path.name)}[/]  {path}", soft_wrap=True)

    hp = Table(title="Architecture and hyper-parameters", show_header=False, title_justify="left")
    n_params = sum(t.n_elements for t in tensors)
    rows = [
        ("family", f"{config.architecture} (decoder-only, pre-norm, RMSNorm, RoPE, SwiGLU)"),
        ("context_length", f"{config.context_length} tokens"),
        ("vocab_size", str(config.vocab_size)),
        ("d_model", str(config.d_model)),
        ("n_layers", str(config.n_layers)),
        (
            "n_heads / n_kv_heads",
            f"{config.n_heads} / {config.n_kv_heads}"
            + (" (grouped-query)" if config.n_kv_heads < config.n_heads else ""),
        ),
        ("head_dim", str(config.head_dim)),
        ("d_ff", str(config.d_ff)),
        ("norm_eps", f"{config.norm_eps:g}"),
        ("rope_theta / rope_dim", f"{config.rope_theta:g} / {config.rope_dim}"),
        (
            "output projection",
            "tied to the embedding" if config.tie_word_embeddings else "separate",
        ),
        ("parameters", f"{n_params:,} ({os.path.getsize(path) / 2**20:.1f} MiB on disk)"),
    ]
    for k, v in rows:
        hp.add_row(k, v)
    out.print(hp)

    kinds: dict[str, list] = {}
    for t in tensors:
        kinds.setdefault(re.sub(r"^blk\.\d+\.", "blk.*.", t.name), []).append(t)
    tt = Table(title="Tensors (shape: out × in)", title_justify="left")
    for col in ("tensor", "count", "type", "shape"):
        tt.add_column(col)
    for kind, ts in kinds.items():
        types = ", ".join(sorted({t.type for t in ts}))
        tt.add_row(kind, str(len(ts)), types, " × ".join(map(str, ts[0].shape)))
    out.print(tt)

    tk = Table(title="Tokenizer", show_header=False, title_justify="left")
    tk.add_row(
        "model",
        f"{meta.get('tokenizer.ggml.model')} (pre-tokenizer {meta.get('tokenizer.ggml.pre', '-')})",
    )
    tk.add_row("vocabulary", f"{tok.vocab_size:,} tokens")
    tk.add_row(
        "BOS / EOS",
        f"{tok.bos_id} {tok.id_to_token(tok.bos_id)!r} / "
        f"{tok.eos_id} {tok.id_to_token(tok.eos_id)!r}"
        if tok.bos_id is not None and tok.eos_id is not None
        else f"{tok.bos_id} / {tok.eos_id}",
    )
    tk.add_row("adds BOS", str(tok.add_bos))
    tk.add_row("chat template", "yes" if tok.chat_template else "no")
    out.print(tk)


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
