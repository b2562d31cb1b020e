"""`clearlm compile [MODEL]`: build a model's compiled decode step ahead of time.

The step (:mod:`clearlm.runtime.aot`) is what generate, chat and the Python API decode through
by default; without a built package they start this command in the background and decode
eagerly meanwhile (:mod:`clearlm.api.decode`). Running it by hand (or through ``clearlm pull``
and ``make demo``) builds it before the first answer: 1-3 minutes on 2 cores, once per model
file, load options and clearlm version, kept in ``~/.cache/clearlm/aot``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from clearlm.cli.app import Activations, DType, ModelOpt, Precision, Weights, app, err
from clearlm.cli.loader import QuietOpt, ThreadsOpt, load_model, spinner


@app.command()
def compile(  # noqa: A001 (the command's name)
    model: Annotated[
        str | None, typer.Argument(help="Path or alias (default smollm2-135m-instruct).")
    ] = None,
    model_opt: ModelOpt = None,
    dtype: DType = "float32",
    weights: Weights = None,
    activations: Activations = "float32",
    matmul_precision: Precision = "highest",
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    batch: Annotated[
        bool, typer.Option("--batch", help="Build the batched step `clearlm serve` decodes "
                           "with (1-16 rows at once) instead of the one-row step.")
    ] = False,
) -> None:
    """Build MODEL's compiled decode step now (1-3 minutes on 2 cores, once), so that no run
    decodes eagerly while it builds. Prints the package's path on stdout.

    The options must match the runs that will use it (--weights, --dtype, --activations,
    --matmul-precision); the thread count does not matter.
    """
    if model is not None and model_opt is not None and model != model_opt:
        raise typer.BadParameter(f"two models given: {model!r} and -m {model_opt!r}; give one")
    m = load_model(model if model is not None else model_opt, dtype, threads, quiet,
                   weights=weights, matmul_precision=matmul_precision, activations=activations,
                   decode="eager")
    print(build_step(m, quiet, batch))


def build_step(m: Any, quiet: bool, batch: bool = False) -> Path:
    """Build (or check) the compiled decode step of the loaded model ``m`` in this process,
    waiting for a build another process holds the lock of; a spinner on stderr unless quiet.

    ``batch``: the batched step of the serving engine (clearlm.runtime.aot_batch).

    Returns: the package's path. Raises typer.Exit(1) after one ``error:`` line when the step
    cannot be built (remembered in ``<package>.failed``, so runs decode eagerly without trying
    again until this command is run).
    """
    from clearlm.runtime.aot import AOTDecodeStep, failed_path, release_lock, take_lock
    from clearlm.runtime.aot_batch import BatchDecodeStep

    if m.config.n_experts:
        err.print(f"error: {m.config.family} is a mixture of experts, which always decodes "
                  "eagerly: it has no compiled step to build", soft_wrap=True, markup=False)
        raise typer.Exit(1)
    errors: list[Exception] = []
    kind = BatchDecodeStep if batch else AOTDecodeStep
    what = "batched decode step" if batch else "decode step"
    step = kind(m.transformer, on_error=errors.append)
    path = step.package_path()
    if path.exists():
        step.prepare()  # checks that it loads
    else:
        while not take_lock(path):  # another process builds it: wait for that build
            time.sleep(2.0)
            if path.exists():
                break
        try:
            failed_path(path).unlink(missing_ok=True)  # this run tries again
            t0 = time.perf_counter()
            took_min = "2-5" if batch else "1-3"  # SmolLM2 on 2 cores (docs/serving.md)
            with spinner(f"building the compiled {what} ({took_min} minutes, once)…", not quiet):
                step.prepare()
            if errors:
                failed_path(path).write_text(f"{errors[0]}\n")
            elif not quiet:
                took = time.perf_counter() - t0
                err.print(f"[dim]built the compiled {what} in {took:.0f} s[/]")
        finally:
            release_lock(path)
    if errors:
        users = "serve" if batch else "generate and chat"
        err.print(f"error: {errors[0]}; {users} will decode eagerly", soft_wrap=True,
                  markup=False)
        raise typer.Exit(1)
    return path
