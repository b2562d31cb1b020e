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
from clearlm.cli.context_size import (
    CtxSize,
    check_prompt,
    context_limit,
    generate_within,
    warn_past_model,
)  # fmt: skip
from clearlm.cli.gen_options import (
    CompileOpt,
    EagerOpt,
    File,
    GrammarOpt,
    Json,
    JsonSchemaOpt,
    Logprobs,
    MaxNew,
    MinP,
    NoOffload,
    PromptOpt,
    RepPen,
    Seed,
    Stop,
    Temp,
    TopK,
    TopP,
    check_before_load,
    decode_mode,
    pick_prompt,
    read_grammar,
    sampling_options,
)  # fmt: skip
from clearlm.cli.loader import (
    QuietOpt,
    ThreadsOpt,
    compile_seconds,
    load_model,
    model_label,
    set_decode,
)  # fmt: skip
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
    decode: str = "eager",
    matmul_precision: str = "highest",
    activations: str = "float32",
    ctx_size: int = 0,
    grammar: str | None = None,
    speculative: dict[str, Any] | None = None,
) -> None:
    """Load, build the prompt, stream the text (or print one JSON object at the end); stats
    (and any interruption) go to stderr. A closed stdout pipe ends quietly with status 0.
    In a parallel run every rank generates alike and only rank 0 prints. ``ctx_size``: -c
    (clearlm.cli.context_size). ``decode``: the decode mode (clearlm.api.decode), set after the
    loading line where a decode step follows (-n 2 or more). ``speculative``: the --draft /
    --prompt-lookup / --num-draft values (clearlm.cli.speculative).

    Sampling values: the user's options over the model's generation_config.json over the
    command's defaults (GENERATE_DEFAULTS; chat: clearlm.sampling.defaults.chat_defaults).
    ``grammar``: structured output (:func:`clearlm.cli.gen_options.read_grammar`).
    """
    stop = check_before_load(model_name, sampling, fallback, stop)  # before torch's import
    from clearlm.generation.grammar import grammar_state

    placement = placement or pl.Placement()
    spec = speculative or dict(draft=None, prompt_lookup=False, num_draft=None)
    check_speculative(**spec, parallel=placement.parallel, compiled=decode == "compiled")
    from clearlm.runtime.parallel.launch import shared_seed, shutdown
    from clearlm.sampling.defaults import chat_defaults

    as_json = as_json or logprobs is not None
    given = {k: v for k, v in sampling.items() if v is not None}
    # The prompt is built on the header first: no chat template or too long fails before weights
    prints = placement.prints
    quiet = quiet or not prints
    model = load_model(
        model_name, dtype, threads, quiet,
        check=lambda m: check_prompt(len(build_prompt(m)), m.config.context_length, ctx_size),
        chat=chat,
        placement=placement,
        weights=weights, matmul_precision=matmul_precision, activations=activations,
    )  # fmt: skip
    if prints:
        warn_past_model(model.config.context_length, ctx_size)
    options = dict(dtype=dtype, threads=threads, weights=weights,
                   matmul_precision=matmul_precision, activations=activations)  # fmt: skip
    drafter = load_drafter(model, **spec, quiet=quiet, **options)
    if max_new_tokens >= 2 and drafter is None:  # -n 0 / 1: no decode step follows
        set_decode(model, decode, quiet)  # (speculative runs verify in k-token passes)
    if chat:  # the model's generation_config.json, else ollama's settings
        fallback = chat_defaults(model.generation_defaults, given)
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
        result, n_new = generate_within(
            model, ids, params, max_new_tokens, stop or (), None if as_json else echo, ctx_size,
            grammar_state(model.tokenizer, model.config.vocab_size, grammar), drafter,
        )
    except KeyboardInterrupt:  # keep what was printed; say so on stderr
        write_out("\n")
        n = len("".join(shown))  # characters shown
        err.print(f"[yellow]interrupted after {n} character{'s' * (n != 1)}[/]")
        raise typer.Exit(130) from None
    shutdown()
    if not prints:
        return
    if as_json:
        out = result_json(model, ids, result, logprobs, n_new, params, model_label(model_name))
        write_out(json.dumps(out, ensure_ascii=False) + "\n")
        return
    write_out("\n")
    if not quiet:
        limit = context_limit(model.config.context_length, ctx_size)[0]
        print_stats(result, limit, compile_seconds(model))


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
    ctx_size: CtxSize = 0,
    temperature: Temp = None,
    top_k: TopK = None,
    top_p: TopP = None,
    min_p: MinP = None,
    repetition_penalty: RepPen = None,
    seed: Seed = None,
    stop: Stop = None,
    json_schema: JsonSchemaOpt = None,
    grammar: GrammarOpt = None,
    ignore_eos: Annotated[
        bool,
        typer.Option("--ignore-eos", help="Go on past the model's end token: exactly "
                     "--max-new-tokens tokens (unless --stop or the context ends it)."),
    ] = False,
    dtype: DType = "float32",
    weights: Weights = None,
    as_json: Json = False,
    logprobs: Logprobs = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    device: pl.DeviceOpt = "cpu",
    n_gpu_layers: NoOffload = None,
    tensor_parallel: pl.TensorParallelOpt = 1,
    pipeline_parallel: pl.PipelineParallelOpt = 1,
    dist_timeout: pl.DistTimeoutOpt = 30.0,
    compile_decode: CompileOpt = False,
    eager: EagerOpt = False,
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
    sampling["ignore_eos"] = ignore_eos or None  # SamplingParams.ignore_eos; None: unset
    compiled = read_grammar(json_schema, grammar)
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
        decode=decode_mode(compile_decode, eager),
        matmul_precision=matmul_precision,
        activations=activations,
        ctx_size=ctx_size,
        grammar=compiled,
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
    ctx_size: CtxSize = 0,
    temperature: Temp = None,
    top_k: TopK = None,
    top_p: TopP = None,
    min_p: MinP = None,
    repetition_penalty: RepPen = None,
    seed: Seed = None,
    stop: Stop = None,
    json_schema: JsonSchemaOpt = None,
    grammar: GrammarOpt = None,
    dtype: DType = "float32",
    weights: Weights = None,
    as_json: Json = False,
    logprobs: Logprobs = None,
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    device: pl.DeviceOpt = "cpu",
    n_gpu_layers: NoOffload = None,
    tensor_parallel: pl.TensorParallelOpt = 1,
    pipeline_parallel: pl.PipelineParallelOpt = 1,
    dist_timeout: pl.DistTimeoutOpt = 30.0,
    compile_decode: CompileOpt = False,
    eager: EagerOpt = False,
    matmul_precision: Precision = "highest",
    activations: Activations = "float32",
    draft: DraftOpt = None,
    prompt_lookup: PromptLookupOpt = False,
    num_draft: NumDraftOpt = None,
) -> None:
    """Answer MESSAGE with the model's own chat template; with no MESSAGE, a conversation: one
    message a line, /help for commands, Ctrl-D to leave. The messages are text: control tokens
    come only from the template.

    Sampling: a model folder's generation_config.json, else ollama's defaults (temperature 0.8,
    top-k 40, top-p 0.9, repetition penalty 1.1); an option you give wins, and --temperature 0
    is greedy."""
    from clearlm.sampling.defaults import CHAT_DEFAULTS  # no torch: usage errors answer at once

    text = resolve_prompt(pick_prompt(message, prompt_opt, "MESSAGE"), file, "MESSAGE")
    system = None if system is None else clean_arg(system)  # undecodable bytes → U+FFFD
    stops, special = [clean_arg(x) for x in stop or ()], parse_special_in_content
    sampling = sampling_options(temperature, top_k, top_p, min_p, repetition_penalty, seed)
    placement = pl.Placement(device, tensor_parallel, pipeline_parallel, dist_timeout)
    spec = dict(draft=draft, prompt_lookup=prompt_lookup, num_draft=num_draft)
    if text is None:
        if as_json or logprobs is not None or json_schema or grammar:
            raise typer.BadParameter(
                "--json, --logprobs, --json-schema and --grammar need a MESSAGE (not a "
                "conversation)", param_hint="'--json'",
            )  # fmt: skip
        if placement.parallel:
            raise typer.BadParameter("a conversation runs in one process; give a MESSAGE")
        from clearlm.cli.repl import conversation

        conversation(
            model, dtype, system, max_new_tokens, stops, sampling, special, threads, quiet,
            placement,
            weights, matmul_precision, activations, decode_mode(compile_decode, eager), ctx_size,
            spec,
        )  # fmt: skip
        return
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": text}
    ]
    _run(
        model, dtype, lambda m: m.chat_prompt(messages, special), max_new_tokens, stops,
        sampling, CHAT_DEFAULTS, as_json, logprobs, threads, quiet, chat=True,
        placement=placement, weights=weights, decode=decode_mode(compile_decode, eager),
        matmul_precision=matmul_precision, activations=activations, ctx_size=ctx_size,
        grammar=read_grammar(json_schema, grammar), speculative=spec,
    )  # fmt: skip

