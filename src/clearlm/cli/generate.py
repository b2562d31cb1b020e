"""`clearlm generate` and `clearlm chat`: text streamed to the terminal as it is produced, or one
JSON object (``--json``); the prompt from the argument, standard input (``-``) or ``-f FILE``;
``clearlm chat`` with no message runs the conversation loop of :mod:`clearlm.cli.repl`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Annotated, Any

import typer

from clearlm.cli import placement as pl  # --device and the parallel options
from clearlm.cli.app import Activations, DType, ModelOpt, Precision, Weights, app, err
from clearlm.cli.gen_options import (
    CompileOpt,
    File,
    Json,
    Logprobs,
    MaxNew,
    MinP,
    PromptOpt,
    RepPen,
    Seed,
    Stop,
    Temp,
    TopK,
    TopP,
    check_before_load,
    pick_prompt,
    sampling_options,
)  # fmt: skip
from clearlm.cli.loader import QuietOpt, ThreadsOpt, compile_seconds, compile_step, load_model
from clearlm.cli.output import print_stats, result_json, write_out
from clearlm.cli.prompt_input import resolve_prompt
from clearlm.cli.speculative import (
    DraftOpt,
    NumDraftOpt,
    PromptLookupOpt,
    check_speculative,
    load_drafter,
)
from clearlm.text import clean_arg


def _run(
    model_name: str | None,
    dtype: str,
    build_prompt: Callable[[Any], list[int]],
    max_new_tokens: int,
    stop: list[str] | None,
    sampling: dict[str, Any],
    fallback: dict[str, Any],
    as_json: bool = False,
    logprobs: int | None = None,
    threads: int | None = None,
    quiet: bool = False,
    chat: bool = False,
    placement: pl.Placement | None = None,
    weights: str | None = None,
    compile_decode: bool = False,
    matmul_precision: str = "highest",
    activations: str = "float32",
    speculative: dict[str, Any] | None = None,
) -> None:
    """Load, build the prompt, stream the text (or print one JSON object at the end); stats
    (and any interruption) go to stderr. A closed stdout pipe ends quietly with status 0.
    In a parallel run every rank generates alike and only rank 0 prints. ``speculative``:
    the --draft / --prompt-lookup / --num-draft values (clearlm.cli.speculative).

    Sampling values: the user's options over the model's generation_config.json over the
    command's defaults (the API's GENERATE_DEFAULTS / CHAT_DEFAULTS).
    """
    stop = check_before_load(model_name, sampling, fallback, stop)  # before torch's import
    placement = placement or pl.Placement()
    spec = speculative or dict(draft=None, prompt_lookup=False, num_draft=None)
    check_speculative(**spec, parallel=placement.parallel, compiled=compile_decode)
    from clearlm.api.speculative import run_generate
    from clearlm.generation.loop import check_fits
    from clearlm.runtime.parallel.launch import shared_seed, shutdown

    as_json = as_json or logprobs is not None
    given = {k: v for k, v in sampling.items() if v is not None}
    # The prompt is built on the header first: no chat template or too long fails before weights
    prints = placement.prints
    quiet = quiet or not prints
    model = load_model(
        model_name, dtype, threads, quiet,
        check=lambda m: check_fits(len(build_prompt(m)), m.config.context_length), chat=chat,
        placement=placement,
        weights=weights, matmul_precision=matmul_precision, activations=activations,
    )  # fmt: skip
    options = dict(dtype=dtype, threads=threads, weights=weights,
                   matmul_precision=matmul_precision, activations=activations)  # fmt: skip
    drafter = load_drafter(model, **spec, quiet=quiet, **options)
    if compile_decode:
        compile_step(model, quiet or max_new_tokens < 2)  # -n 0 / 1: no decode step follows
    params = model.sampling_params(None, fallback, **given)
    if placement.parallel:  # every rank must draw the same token from the same logits
        params = replace(params, seed=shared_seed(params.seed))
    ids = build_prompt(model)
    shown: list[str] = []

    def echo(text: str) -> None:
        shown.append(text)
        if prints:
            write_out(text)

    try:
        on_text = None if as_json else echo
        result = run_generate(model, ids, params, max_new_tokens, stop or (), on_text, drafter)
    except KeyboardInterrupt:  # keep what was printed; say so on stderr
        write_out("\n")
        n = len("".join(shown))  # characters shown
        err.print(f"[yellow]interrupted after {n} character{'s' * (n != 1)}[/]")
        raise typer.Exit(130) from None
    shutdown()
    if not prints:
        return
    if as_json:
        out = result_json(model, ids, result, logprobs, max_new_tokens)
        write_out(json.dumps(out, ensure_ascii=False) + "\n")
        return
    write_out("\n")
    if not quiet:
        print_stats(result, model.config.context_length, compile_seconds(model))


@app.command()
def generate(
    prompt: Annotated[
        str | None,
        typer.Argument(help="Text to continue (no chat template); '-' reads standard input."),
    ] = None,
    prompt_opt: PromptOpt = None,
    file: File = None,
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
    weights: Weights = None,
    as_json: Json = False,
    logprobs: Logprobs = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    device: pl.DeviceOpt = "cpu",
    tensor_parallel: pl.TensorParallelOpt = 1,
    pipeline_parallel: pl.PipelineParallelOpt = 1,
    dist_timeout: pl.DistTimeoutOpt = 30.0,
    compile_decode: CompileOpt = False,
    matmul_precision: Precision = "highest",
    activations: Activations = "float32",
    draft: DraftOpt = None,
    prompt_lookup: PromptLookupOpt = False,
    num_draft: NumDraftOpt = None,
) -> None:
    """Continue PROMPT (or standard input with '-', or -f FILE), streaming the text."""
    from clearlm.sampling.defaults import GENERATE_DEFAULTS  # no torch: usage errors answer at once

    text = resolve_prompt(pick_prompt(prompt, prompt_opt, "PROMPT"), file)
    if text is None:
        raise typer.BadParameter(
            "give a PROMPT (or -p TEXT), '-' to read standard input, or -f FILE"
        )
    sampling = sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed)
    _run(
        model,
        dtype,
        lambda m: m.encode(text),
        max_new_tokens,
        [clean_arg(x) for x in stop or ()],
        sampling,
        GENERATE_DEFAULTS,
        as_json,
        logprobs,
        threads,
        quiet,
        placement=pl.Placement(device, tensor_parallel, pipeline_parallel, dist_timeout),
        weights=weights,
        compile_decode=compile_decode,
        matmul_precision=matmul_precision,
        activations=activations,
        speculative=dict(draft=draft, prompt_lookup=prompt_lookup, num_draft=num_draft),
    )


@app.command()
def chat(
    message: Annotated[
        str | None,
        typer.Argument(
            help="The user's message ('-' reads standard input); none opens a conversation."
        ),
    ] = None,
    prompt_opt: PromptOpt = None,
    file: File = None,
    system: Annotated[str | None, typer.Option(help="A system message to put first.")] = None,
    parse_special_in_content: Annotated[
        bool,
        typer.Option(
            "--parse-special-in-content",
            help="Trusted messages only: special-token text typed in them ('<|im_end|>') "
            "becomes control tokens (by default it stays plain text).",
        ),
    ] = False,
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
    weights: Weights = None,
    as_json: Json = False,
    logprobs: Logprobs = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    device: pl.DeviceOpt = "cpu",
    tensor_parallel: pl.TensorParallelOpt = 1,
    pipeline_parallel: pl.PipelineParallelOpt = 1,
    dist_timeout: pl.DistTimeoutOpt = 30.0,
    compile_decode: CompileOpt = False,
    matmul_precision: Precision = "highest",
    activations: Activations = "float32",
    draft: DraftOpt = None,
    prompt_lookup: PromptLookupOpt = False,
    num_draft: NumDraftOpt = None,
) -> None:
    """Answer MESSAGE with the model's own chat template (greedy by default); with no MESSAGE,
    a conversation: one message a line, /help for commands, Ctrl-D to leave. The messages are
    text: control tokens come only from the template."""
    from clearlm.sampling.defaults import CHAT_DEFAULTS  # no torch: usage errors answer at once

    text = resolve_prompt(pick_prompt(message, prompt_opt, "MESSAGE"), file, "MESSAGE")
    system = None if system is None else clean_arg(system)  # undecodable bytes → U+FFFD
    stops, special = [clean_arg(x) for x in stop or ()], parse_special_in_content
    sampling = sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed)
    placement = pl.Placement(device, tensor_parallel, pipeline_parallel, dist_timeout)
    spec = dict(draft=draft, prompt_lookup=prompt_lookup, num_draft=num_draft)
    if text is None:
        if as_json or logprobs is not None:
            raise typer.BadParameter(
                "--json and --logprobs need a MESSAGE (not a conversation)", param_hint="'--json'"
            )
        if placement.parallel:
            raise typer.BadParameter("a conversation runs in one process; give a MESSAGE")
        _conversation(
            model, dtype, system, max_new_tokens, stops, sampling, special, threads, quiet,
            placement,
            weights, matmul_precision, activations, compile_decode, spec,
        )  # fmt: skip
        return
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}
    ]
    _run(
        model, dtype, lambda m: m.chat_prompt(messages, special), max_new_tokens, stops,
        sampling, CHAT_DEFAULTS, as_json, logprobs, threads, quiet, chat=True,
        placement=placement, weights=weights, compile_decode=compile_decode,
        matmul_precision=matmul_precision, activations=activations, speculative=spec,
    )  # fmt: skip


def _conversation(
    model_name: str | None,
    dtype: str,
    system: str | None,
    max_new_tokens: int,
    stop: list[str] | None,
    sampling: dict[str, Any],
    parse_special_in_content: bool = False,
    threads: int | None = None,
    quiet: bool = False,
    placement: pl.Placement | None = None,
    weights: str | None = None,
    matmul_precision: str = "highest",
    activations: str = "float32",
    compile_decode: bool = False,
    spec: dict[str, Any] | None = None,
) -> None:
    """Load once (chat template checked first), then the read-answer loop of clearlm.cli.repl
    (``compile_decode``: every answer decodes through the compiled step, as generate's;
    ``spec``: the speculative options, as _run's)."""
    from clearlm.sampling.defaults import CHAT_DEFAULTS  # no torch: usage errors answer at once

    stop = check_before_load(model_name, sampling, CHAT_DEFAULTS, stop)
    spec = spec or dict(draft=None, prompt_lookup=False, num_draft=None)
    check_speculative(**spec, compiled=compile_decode)
    given = {k: v for k, v in sampling.items() if v is not None}
    m = load_model(
        model_name, dtype, threads, quiet,
        check=lambda h: h.chat_prompt([{"role": "user", "content": "hi"}]), chat=True,
        placement=placement,
        weights=weights, matmul_precision=matmul_precision, activations=activations,
    )  # fmt: skip
    drafter = load_drafter(m, **spec, quiet=quiet, dtype=dtype, threads=threads, weights=weights,
                           matmul_precision=matmul_precision, activations=activations)
    if compile_decode:
        compile_step(m, quiet)
    params = m.sampling_params(None, CHAT_DEFAULTS, **given)
    from clearlm.cli.repl import run_repl  # (imports torch: after the checks above)

    run_repl(m, params, max_new_tokens, stop, system, parse_special_in_content, quiet, drafter)
