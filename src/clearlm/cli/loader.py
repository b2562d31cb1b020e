"""What every model-running command shares: ``--threads``, ``--quiet``, and a load that says
what it is doing.

:func:`load_model` sets the thread count (see :mod:`clearlm.runtime.threads`), lets the command
check
its input against the model's header (tokenizer, chat template, context length) before the slow
weight load, then loads and prints one line on stderr::

    loading smollm2-135m-instruct (98 MB)… done in 6.4 s · 2 threads

On a terminal a spinner with the elapsed time shows while a load takes longer than half a second.
``--quiet`` prints nothing but errors (and an interruption: Ctrl-C while loading says
``interrupted while loading MODEL`` and exits 130).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from clearlm.cli.app import err
from clearlm.runtime.threads import MAX_THREADS

ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        "-t",
        min=1,
        max=MAX_THREADS,
        help="CPU threads for torch. Default: the free cores (physical cores allowed to this "
        "process, less those other processes keep busy), or $OMP_NUM_THREADS when set.",
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="Print only the output and errors: no loading line, stats."),
]

SPINNER_AFTER_S = 0.5  # a load shorter than this shows no spinner


def human_size(n_bytes: int) -> str:
    """Bytes in decimal units as a person reads them: 98 MB, 1.1 GB, 310 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n_bytes} B"


@contextmanager
def spinner(label: str, enabled: bool) -> Iterator[None]:
    """A transient spinner + elapsed time on stderr, started only after SPINNER_AFTER_S; where
    stderr is not a terminal (a log, a pipe), the label once instead, so a long wait is not
    silent there."""
    if not enabled:
        yield
        return
    if not err.is_terminal:
        err.print(label, style="dim", markup=False, soft_wrap=True)
        yield
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(
        SpinnerColumn(), TextColumn(label), BarColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    )  # fmt: skip
    bar.add_task(label, total=None)  # no total: the bar pulses
    lock, state = threading.Lock(), {"done": False, "started": False}

    def start() -> None:
        with lock:
            if not state["done"]:
                bar.start()
                state["started"] = True

    timer = threading.Timer(SPINNER_AFTER_S, start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["started"]:
                bar.stop()


def load_model(
    name: str | None,
    dtype: str = "float32",
    threads: int | None = None,
    quiet: bool = False,
    check: Callable[[Any], object] | None = None,
    chat: bool = False,
    placement: Any = None,
    weights: str | None = None,
    matmul_precision: str = "highest",
    activations: str = "float32",
    decode: str = "eager",
) -> Any:
    """Set the threads, load (checking the input on the header first), say so on stderr.

    Args:
        name: a .gguf file, a Hugging Face folder, an alias, or None (the default model).
        dtype: parameter dtype name.
        threads: torch threads (≥ 1); None: :func:`clearlm.runtime.threads.set_threads`' default.
        quiet: print nothing on success.
        check: called with a weightless Model before the weights are read (see
            :func:`clearlm.api.model.load`); it raises to stop early (a missing chat template, a
            prompt longer than the context).
        chat: the command needs a chat template: a GGUF without one is refused at once, from
            its key names alone (``Checkpoint.has_chat_template``: loading/peek.py, ~0.03 s).
        placement: a :class:`clearlm.cli.placement.Placement` (device, parallel ranks).
        weights: "compact", "float32" or None (the API's default: :func:`clearlm.api.model.load`).
        matmul_precision: "highest" or "medium" (clearlm.runtime.precision).
        activations: "float32" or "int8" (:func:`clearlm.api.model.load`).
        decode: the decode mode (:mod:`clearlm.api.decode`): "eager" here; the commands that
            decode set their step after the loading line (:func:`attach_decode_step`).

    Returns:
        The loaded :class:`clearlm.api.model.Model`.

    Raises:
        whatever resolving, checking or loading raises (ClearLMError subclasses).
    """
    from clearlm.store.catalog import ALIASES, DEFAULT_MODEL, resolve_model

    path = resolve_model(name)  # before torch's import (~2 s): a wrong name answers at once
    import torch

    from clearlm.api.model import load, parse_dtype, parse_weights
    from clearlm.api.options import parse_activations
    from clearlm.errors import ChatTemplateError, InvalidModelFileError
    from clearlm.loading.checkpoint import open_checkpoint
    from clearlm.runtime.devices import resolve_device
    from clearlm.runtime.precision import cpu_has_bf16_units
    from clearlm.runtime.threads import default_threads, set_threads

    torch_dtype = parse_dtype(dtype)
    where = placement.load_kwargs() if placement is not None else {}
    ranks = max(where.get("tensor_parallel", 1), where.get("pipeline_parallel", 1))
    device = resolve_device(where.get("device", "cpu"))
    # refused now, before the header is read: compact with a half dtype, a GPU or ranks
    weights = parse_weights(weights, torch_dtype, device, ranks)
    parse_activations(activations, weights, torch_dtype)
    ckpt = open_checkpoint(path)
    if chat and ckpt.has_chat_template() is False:
        from clearlm.loading.peek import gguf_keys

        if "tokenizer.ggml.model" not in (gguf_keys(path) or ()):  # generate cannot run it
            raise InvalidModelFileError(f"{path.name} has no tokenizer (no tokenizer.ggml.* "
                                        "keys): it cannot encode text; use a complete GGUF")
        raise ChatTemplateError(
            f"{path.name} has no chat template (a base model?); use `clearlm generate`"
        )
    if threads is not None:  # allowed (it runs), but said: more threads than cores is slower
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        warning = threads_warning(threads, cpus or 1, default_threads())
        if warning:
            err.print(f"[yellow]warning: {warning}[/]", soft_wrap=True)
    n_threads = set_threads(threads)
    # "medium" only changes float32 products; a bfloat16/float16 model's are half already
    scoped = matmul_precision != "highest" and torch_dtype == torch.float32
    if scoped and not cpu_has_bf16_units():  # allowed, said honestly
        err.print("[yellow]warning: this CPU lists no bfloat16 units (AMX, AVX512-BF16): "
                  "--matmul-precision medium may be slower than highest here[/]", soft_wrap=True)
    shown = model_label(name) if (name or DEFAULT_MODEL) in ALIASES else path.name
    label = f"loading {shown} ({human_size(ckpt.size_bytes)})"
    start = time.perf_counter()
    try:
        with spinner(label + "…", enabled=not quiet and err.is_terminal), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "clearlm: int8 activations")  # said below
            model = load(
                path, torch_dtype, check=check, threads=n_threads, weights=weights,
                matmul_precision=matmul_precision, activations=activations, decode=decode,
                **where,
            )  # fmt: skip
    except KeyboardInterrupt:  # said even with --quiet: the command did not do its job
        err.print(f"[yellow]interrupted while loading {shown}[/]", soft_wrap=True)
        raise typer.Exit(130) from None
    if model.activations != activations:  # int8 asked, no int8 kernel: allowed, said once
        err.print("[yellow]warning: --activations int8 needs the int8 kernel (AVX-512 VNNI or "
                  "AVX2), which is not built here; decode stays exact float32[/]", soft_wrap=True)
    if not quiet:
        s = "" if n_threads == 1 else "s"
        # dense weights are held in the dtype asked (bfloat16's are half float32's bytes)
        held = "compact" if model.weights == "compact" else str(torch_dtype).removeprefix("torch.")
        err.print(
            f"[dim]{label}… done in {time.perf_counter() - start:.1f} s · {n_threads} thread{s}"
            f" · {held} weights {human_size(model.weight_bytes)}"
            + precision_note(matmul_precision, scoped, dtype)
            + (" · int8 activations" if model.activations == "int8" else "") + "[/]",
            soft_wrap=True,
        )
    return model


def model_label(name: str | None) -> str:
    """The model as banners, ``--json`` and the page name it: its alias (the default model's
    when ``name`` is None), or the path as the user gave it, never a site-packages path."""
    from clearlm.store.catalog import DEFAULT_MODEL

    return name or DEFAULT_MODEL


def threads_warning(threads: int, cpus: int, free: int) -> str | None:
    """What to say about ``--threads N`` (None: nothing): more than the ``cpus`` this process
    may use, or more than the cores ``free`` now (clearlm.runtime.threads.default_threads: the
    usable
    cores less those other processes keep busy), where every matrix product waits for the
    thread whose core another process holds (decode fell from 30 to 0.5-1.7 tok/s)."""
    if threads > cpus:
        return (f"--threads {threads} is more than the {cpus} CPUs here; decoding will be "
                "slower than with fewer")
    if threads > free:
        s = "" if free == 1 else "s"
        return (f"--threads {threads} is more than the {free} core{s} free now (other processes "
                f"keep the rest busy); decoding may be slower than with --threads {free}")
    return None


def precision_note(matmul_precision: str, scoped: bool, dtype: str) -> str:
    """The loading line's word on --matmul-precision: "" for highest, " · medium matmuls" where
    it applies (float32 compute), else that it has no effect (a bfloat16/float16 model)."""
    if matmul_precision == "highest":
        return ""
    if scoped:
        return f" · {matmul_precision} matmuls"
    return f" · --matmul-precision {matmul_precision} has no effect in {dtype}"


def set_decode(model: Any, mode: str, quiet: bool = False) -> None:
    """Set the loaded model's decode step for ``mode`` (clearlm.api.decode: "auto" compiled
    when built, else built in the background while decoding eagerly; "compiled" built or
    loaded now, before the first token, under a spinner; "eager"), saying so on stderr:
    warnings always, other lines unless quiet. ``CLEARLM_COMPILE=jit`` with "compiled": the
    torch.compile step instead (clearlm.runtime.compiled; imported only then, as it pulls in
    torch._dynamo), compiled at the first decode step."""
    if mode == "compiled" and os.environ.get("CLEARLM_COMPILE", "aot") == "jit":
        from clearlm.runtime.compiled import cache_dir, compile_decode

        compile_decode(model.transformer)
        if not quiet:
            err.print(f"[dim]--compile: the first decode step compiles (seconds to minutes; "
                      f"cached in {cache_dir()})[/]", soft_wrap=True)
        return
    from clearlm.api.decode import attach_decode

    def notice(line: str) -> None:
        warning = line.startswith("warning:")
        if warning or not quiet:
            err.print(line, style="yellow" if warning else "dim", markup=False, soft_wrap=True)

    step = attach_decode(model, mode, notice)
    if mode == "auto" and step is not None:
        step.start_if_missing()  # its notice now, before the text, not inside it
    if mode != "compiled" or step is None:
        return
    if step.ready():
        step.prepare()  # a package on disk: milliseconds
        return
    t0 = time.perf_counter()
    label = "building the compiled decode step (1-3 minutes on 2 cores, once for this model)…"
    with spinner(label, enabled=not quiet and err.is_terminal):
        if not quiet and not err.is_terminal:
            err.print(label, style="dim", markup=False, soft_wrap=True)
        step.prepare()
    if not quiet and step.loader is not None:
        err.print(f"built the compiled decode step in {time.perf_counter() - t0:.0f} s: "
                  f"{step.path}", style="dim", markup=False, soft_wrap=True)


def compile_seconds(model: Any) -> float | None:
    """Wall seconds the compiled step's first call took in this process (None: no compiled
    step, one that compiled nothing yet, an AOT package loaded from disk in milliseconds, or one
    built before the first token, whose time set_decode already said)."""
    step = getattr(model.transformer, "decode_fn", None)
    if getattr(step, "built", None) is False or getattr(step, "ahead", False):
        return None
    return getattr(step, "compile_s", None)
