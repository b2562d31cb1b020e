"""`clearlm serve`: the OpenAI-compatible HTTP API (see :mod:`clearlm.serve.app`) on uvicorn.

The port is taken before the (slow) load, so a busy port is one clear line. SIGTERM and Ctrl-C
stop accepting connections, let the requests in flight finish for up to ``--shutdown-timeout``
seconds, cancel the rest, and exit with status 0.
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from clearlm.cli.app import Activations, DType, ModelOpt, Precision, Weights, app, err
from clearlm.cli.gen_options import CompileOpt, EagerOpt, decode_mode
from clearlm.cli.loader import QuietOpt, ThreadsOpt, load_model, spinner
from clearlm.cli.speculative import (
    DraftOpt,
    NumDraftOpt,
    PromptLookupOpt,
    check_speculative,
    load_drafter,
)

API_KEY_ENV = "CLEARLM_API_KEY"
# clearlm.serve.inspect_store's defaults, written here so that the CLI's startup does not
# import the server (tests/serve/test_serve_inspect.py checks they agree)
INSPECT_KEEP, INSPECT_TTL_S = 256, 3600.0


def _warn_inspect_options(ctx: typer.Context, inspect: bool) -> None:
    """One ``warning:`` line when --inspect-keep or --inspect-ttl is given without --inspect
    (they would silently do nothing)."""
    if inspect:
        return
    sources = {p: ctx.get_parameter_source(p) for p in ("inspect_keep", "inspect_ttl")}
    given = [f"--{p.replace('_', '-')}" for p, source in sources.items()
             if source is not None and source.name != "DEFAULT"]
    if given:
        err.print(f"[yellow]warning: {' and '.join(given)} {'has' if len(given) == 1 else 'have'}"
                  " no effect without --inspect; add --inspect to keep completions for "
                  "/v1/inspect/ID[/]", soft_wrap=True)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: assume it may be reachable from outside
        return False


@app.command()
def serve(
    ctx: typer.Context,
    model_arg: Annotated[
        str | None, typer.Argument(metavar="MODEL", help="Same as --model.", show_default=False)
    ] = None,
    model: ModelOpt = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on; 0.0.0.0 for every interface.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free one).")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar=API_KEY_ENV,
            show_default=False,
            help=f"Require 'Authorization: Bearer KEY' on every route (or ${API_KEY_ENV}).",
        ),
    ] = None,  # fmt: skip
    max_batch: Annotated[
        int, typer.Option(min=1, help="Most sequences generated together (batching engine).")
    ] = 8,
    max_seq_len: Annotated[
        int,
        typer.Option(min=1, help="Tokens per sequence (prompt + completion; capped at the model's "
                     "context length). The KV cache holds max-batch x this, allocated at start."),
    ] = 2048,
    max_n: Annotated[int, typer.Option(min=1, help="Most choices (n) per request.")] = 8,
    max_body: Annotated[
        int, typer.Option(min=1024, help="Largest request body accepted, in bytes.")
    ] = 1 << 20,
    name: Annotated[
        str | None,
        typer.Option(
            help="Model id clients send; default the alias or file name.", show_default=False
        ),
    ] = None,
    any_model: Annotated[
        bool,
        typer.Option(help="Answer requests for any model name with this model (for clients "
                     "that insist on a name of their own); default: other names get a 404."),
    ] = False,
    inspect: Annotated[
        bool,
        typer.Option("--inspect", help="Keep each completion's token ids so that GET "
                     "/v1/inspect/ID shows its alternatives and logit lens (same API key only)."),
    ] = False,
    inspect_keep: Annotated[
        int, typer.Option(min=1, help="With --inspect: most completions kept (least recently "
                          "used dropped first; ~8 bytes a token).")
    ] = INSPECT_KEEP,
    inspect_ttl: Annotated[
        float, typer.Option(min=1, help="With --inspect: seconds a completion is kept.")
    ] = INSPECT_TTL_S,
    shutdown_timeout: Annotated[
        float, typer.Option(min=0, help="Seconds in-flight requests get to finish on shutdown.")
    ] = 10.0,
    dtype: DType = "float32",
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    weights: Weights = None,
    matmul_precision: Precision = "highest",
    activations: Activations = "float32",
    compile_decode: CompileOpt = False,
    eager: EagerOpt = False,
    draft: DraftOpt = None,
    prompt_lookup: PromptLookupOpt = False,
    num_draft: NumDraftOpt = None,
) -> None:
    """Serve the model over an OpenAI-compatible API: /v1/completions, /v1/chat/completions,
    /v1/models and /health, on http://127.0.0.1:8000 unless told otherwise (with --inspect,
    also /v1/inspect/ID). Batches decode through the compiled batched step once it is built
    (in the background on first use; --compile builds it before serving, --eager never). With
    --draft or --prompt-lookup, requests are decoded speculatively, one at a time."""
    import logging
    import signal
    import socket
    import sys

    import uvicorn

    from clearlm.errors import ClearLMError
    from clearlm.serve import create_app
    from clearlm.serve.requests import Limits
    from clearlm.serve.server import GracefulServer
    from clearlm.store.catalog import DEFAULT_MODEL

    if model_arg is not None and model is not None:
        raise typer.BadParameter("give the model once: as MODEL or as --model")
    chosen = model_arg or model
    check_speculative(draft, prompt_lookup, num_draft)
    decode = decode_mode(compile_decode, eager)
    if api_key == "":  # `--api-key "$KEY"` with KEY unset would serve with no key at all
        raise typer.BadParameter("the key is empty; give one, or leave --api-key out to serve "
                                 "without a key", param_hint="'--api-key'")
    _warn_inspect_options(ctx, inspect)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        reason = getattr(e, "strerror", None) or str(e)
        raise ClearLMError(f"cannot serve on {host}:{port}: {reason}; try --host/--port") from None
    if not api_key and not is_loopback(host):  # said once the address is known to work
        err.print(
            f"[yellow]warning: serving on {host} without an API key: anyone who can reach this "
            f"machine can use the model; set --api-key or ${API_KEY_ENV}[/]",
            soft_wrap=True,
        )
    m = load_model(chosen, dtype, threads, quiet, weights=weights,
                   matmul_precision=matmul_precision, activations=activations)
    model_id = name or Path(chosen or DEFAULT_MODEL).name  # an alias, or the file's name
    from clearlm.engine.scheduler import build_engine
    from clearlm.engine.speculative import SpeculativeEngine

    drafter = load_drafter(m, draft, prompt_lookup, num_draft, quiet, dtype=dtype,
                           threads=threads, matmul_precision=matmul_precision,
                           activations=activations)  # fmt: skip
    if drafter is not None:  # speculation checks one sequence per pass: no batching
        engine = SpeculativeEngine(m.transformer, m.tokenizer.eos_ids, drafter)
        if not quiet:
            err.print("[dim]speculative decoding: requests are served one at a time "
                      "(--max-batch and --max-seq-len are not used)[/]", soft_wrap=True)
    else:
        engine = build_engine(m.transformer, m.tokenizer.eos_ids, max_batch, max_seq_len)
        set_batch_decode(m, decode, quiet)
    if drafter is None and engine.max_seq_len < max_seq_len:  # capped by the engine: say so
        err.print(f"[yellow]warning: --max-seq-len {max_seq_len} is past the model's context "
                  f"length; each sequence holds {engine.max_seq_len} tokens[/]", soft_wrap=True)
    from clearlm.serve.inspect_store import InspectStore

    kept = InspectStore(inspect_keep, inspect_ttl) if inspect else None
    app_ = create_app(
        m, engine, model_id=model_id, api_key=api_key or None,
        max_body=max_body, limits=Limits(max_n=max_n), any_model=any_model, inspect=kept,
    )  # fmt: skip
    log = logging.getLogger("clearlm.serve")
    if not quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    err.print(
        f"serving {model_id!r} on http://{shown}:{bound}/v1  (Ctrl+C to stop)", soft_wrap=True
    )
    sys.stderr.flush()
    # uvicorn cancels the handlers still running when its grace period ends (a bare 500, a cut
    # stream); the runner is stopped a little before that, so each gets its 503 shutting_down.
    config = uvicorn.Config(
        app_, log_level="warning", timeout_graceful_shutdown=int(shutdown_timeout + 0.999) + 2
    )
    server = GracefulServer(config, lambda: app_.state.runner.stop(), shutdown_timeout)
    # uvicorn handles SIGINT/SIGTERM (graceful shutdown), then re-raises the signal to the
    # handler it found: a no-op one here, so the command ends normally with status 0.
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if not quiet:
        err.print("stopped", soft_wrap=True)


def set_batch_decode(m: Any, mode: str, quiet: bool) -> None:
    """Attach the serving engine's compiled step for ``mode`` (clearlm.api.decode.
    attach_batch_decode), saying so on stderr (warnings always, other lines unless quiet);
    "compiled" builds or loads it now, before serving, under a spinner."""
    from clearlm.api.decode import attach_batch_decode

    def notice(line: str) -> None:
        warning = line.startswith("warning:")
        if warning or not quiet:
            err.print(line, style="yellow" if warning else "dim", markup=False, soft_wrap=True)

    step = attach_batch_decode(m, mode, notice)
    if mode != "compiled" or step is None:
        return
    if step.ready():
        step.prepare()  # a package on disk: milliseconds
        return
    t0 = time.perf_counter()
    label = "building the compiled batched decode step (2-5 minutes on 2 cores, once)…"
    with spinner(label, enabled=not quiet and err.is_terminal):
        if not quiet and not err.is_terminal:
            err.print(label, style="dim", markup=False, soft_wrap=True)
        step.prepare()
    if not quiet and step.loader is not None:
        err.print(f"built the compiled batched decode step in {time.perf_counter() - t0:.0f} s: "
                  f"{step.path}", style="dim", markup=False, soft_wrap=True)
