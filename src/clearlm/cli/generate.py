"""`clearlm generate` and `clearlm chat`: text streamed to the terminal as it is produced."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from clearlm.cli import DType, ModelOpt, app, err
from clearlm.cli.runtime import QuietOpt, ThreadsOpt, load_model

MaxNew = Annotated[
    int, typer.Option("--max-new-tokens", "-n", min=0, help="Most tokens to generate.")
]
# Sampling options default to None: then the model folder's generation_config.json decides,
# and failing that the command's own default (see _run).
Temp = Annotated[
    float | None,
    typer.Option(help="Divide logits by this before softmax; 0 = greedy (default 0.8; chat 0)."),
]
TopK = Annotated[
    int | None, typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off (default 0).")
]
TopP = Annotated[
    float | None,
    typer.Option(
        "--top-p", help="Keep the smallest set with this much probability; 1 = off (default 1)."
    ),
]
MinP = Annotated[
    float | None,
    typer.Option(
        "--min-p", help="Drop tokens below min_p × the top probability; 0 = off (default 0)."
    ),
]
RepPen = Annotated[
    float | None,
    typer.Option("--repetition-penalty", help="CTRL penalty on seen tokens; 1 = off (default 1)."),
]
Seed = Annotated[int | None, typer.Option(help="Random seed: the same seed reproduces a run.")]
Stop = Annotated[list[str] | None, typer.Option("--stop", help="Stop at this string (repeatable).")]


def _run(
    model_name: str | None,
    dtype: str,
    build_prompt: Callable[[Any], list[int]],
    max_new_tokens: int,
    stop: list[str] | None,
    sampling: dict[str, Any],
    fallback: dict[str, Any],
    threads: int | None = None,
    quiet: bool = False,
    chat: bool = False,
) -> None:
    """Load, build the prompt, stream the text; stats (and any interruption) go to stderr.

    Sampling values: the user's options over the model's generation_config.json over the
    command's defaults (the API's GENERATE_DEFAULTS / CHAT_DEFAULTS).
    """
    from clearlm.generation import check_fits, generate
    from clearlm.sampling import SamplingParams

    given = {k: v for k, v in sampling.items() if v is not None}
    SamplingParams(**{**fallback, **given})  # validate the user's values before the slow load
    # The prompt is built on the header first: no chat template, or too long, fails before the
    # weights are read.
    model = load_model(
        model_name, dtype, threads, quiet,
        check=lambda m: check_fits(len(build_prompt(m)), m.config.context_length), chat=chat,
    )  # fmt: skip
    params = model.sampling_params(None, fallback, **given)
    ids = build_prompt(model)
    shown: list[str] = []

    def echo(text: str) -> None:
        shown.append(text)
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        result = generate(
            model.transformer, model.tokenizer, ids, params, max_new_tokens, stop or (), echo
        )
    except KeyboardInterrupt:  # keep what was printed; say so on stderr
        sys.stdout.write("\n")
        sys.stdout.flush()
        err.print(f"[yellow]interrupted after {len(''.join(shown))} characters[/]")
        raise typer.Exit(130) from None
    sys.stdout.write("\n")
    sys.stdout.flush()
    if result.finish_reason == "context_length":
        err.print(
            f"[yellow]stopped: prompt + generated tokens reached the context length "
            f"({model.config.context_length} tokens)[/]"
        )
    if quiet:
        return
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
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Continue PROMPT, streaming the text as it is generated."""
    from clearlm.api import GENERATE_DEFAULTS

    sampling = dict(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
    )
    _run(
        model, dtype, lambda m: m.encode(prompt), max_new_tokens, stop, sampling, GENERATE_DEFAULTS,
        threads, quiet,
    )  # fmt: skip


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
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Answer MESSAGE, rendered with the model's own chat template (greedy by default)."""
    from clearlm.api import CHAT_DEFAULTS

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
    _run(
        model,
        dtype,
        lambda m: m.chat_prompt(messages),
        max_new_tokens,
        stop,
        sampling,
        CHAT_DEFAULTS,
        threads,
        quiet,
        chat=True,
    )
