"""The ``clearlm`` command: generate, chat, info.

Every user mistake ends as one line ``error: ...`` on stderr and a non-zero exit code
(ClearLMError.exit_code); tracebacks are for bugs only.
"""

from __future__ import annotations

import sys
from collections import Counter
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
    """Show a model's architecture, hyper-parameters, tensor types and tokenizer."""
    from dataclasses import asdict

    from clearlm.api import load

    m = load(model)
    out = Console(highlight=False)
    meta = m.metadata
    t = Table(title=f"{meta.get('general.name', m.path)}", show_header=False)
    t.add_row("file", m.path)
    for k, v in asdict(m.config).items():
        t.add_row(k, str(v))
    n_params = sum(p.numel() for p in m.transformer.parameters())
    t.add_row("parameters", f"{n_params:,}")
    counts = Counter(m.tensor_types.values())
    t.add_row("tensor types", ", ".join(f"{k} ×{n}" for k, n in counts.most_common()))
    tok = m.tokenizer
    t.add_row(
        "tokenizer",
        f"{meta.get('tokenizer.ggml.model')} (pre: {meta.get('tokenizer.ggml.pre', '-')}), "
        f"{tok.vocab_size:,} tokens",
    )
    t.add_row("special tokens", f"BOS {tok.bos_id} · EOS {tok.eos_id} · add BOS: {tok.add_bos}")
    t.add_row("chat template", "yes" if tok.chat_template else "no")
    out.print(t)


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
