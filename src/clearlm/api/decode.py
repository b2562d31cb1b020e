"""How a loaded model decodes: through the ahead-of-time compiled step by default, or through
the readable eager step (``decode="eager"``), which tracing, hooks and explain always use.

Three modes (``clearlm.load(decode=...)``, the CLI's ``--eager`` / ``--compile``):

- ``"auto"`` (the default): the compiled step (:mod:`clearlm.runtime.aot`) when its package for
  this model is built; when it is not, ``clearlm compile`` builds it in a background process
  (1-3 minutes on 2 cores, once per model and clearlm version) while this process decodes
  eagerly, and the first step after the package appears runs compiled. No answer waits.
- ``"compiled"``: build (or load) the package before the first token, in this process.
- ``"eager"``: no compiled step.

``$CLEARLM_DECODE`` sets the default mode (the test suite runs with ``eager``, so that no test
starts a build it did not ask for). A step the package cannot serve (hooks active, a batch, a
tensor- or pipeline-parallel rank, an unsupported shape) runs eagerly with the same values.
A mixture-of-experts model (model/moe.py) always decodes eagerly: which experts run depends on
each token, so there is no one static graph to compile.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clearlm.errors import SamplingParamsError

if TYPE_CHECKING:
    from clearlm.runtime.aot import AOTDecodeStep
    from clearlm.runtime.aot_batch import BatchDecodeStep

DECODE_MODES = ("auto", "compiled", "eager")
ENV = "CLEARLM_DECODE"


def parse_decode(value: str | None) -> str:
    """A decode mode: ``value``, else ``$CLEARLM_DECODE``, else "auto" (no torch: the CLI
    checks it before loading).

    Raises:
        SamplingParamsError: not one of auto, compiled, eager (naming where it came from).
    """
    where = "decode"
    if value is None:
        value, where = os.environ.get(ENV) or "auto", f"${ENV}"
    if value not in DECODE_MODES:
        raise SamplingParamsError(
            f"{where} must be one of {', '.join(DECODE_MODES)}, got {value!r}"
        )
    return value


def compile_argv(model: Any) -> list[str]:
    """``clearlm compile``'s arguments that load ``model`` (a clearlm Model) as it is loaded
    here, so that the background build writes the package this process looks for (its key
    depends on the file, the weights mode, the dtype, the int8 switches and the matmul
    precision; not on the thread count, so the build takes one thread and leaves the others
    to decoding)."""
    tf = model.transformer
    dtype = next(p.dtype for p in tf.parameters() if p.is_floating_point())
    return [str(model.path), "--weights", model.weights,
            "--dtype", str(dtype).removeprefix("torch."), "--activations", model.activations,
            "--matmul-precision", getattr(tf, "matmul_precision", "highest"), "--threads", "1"]


def attach_decode(
    model: Any, mode: str, notice: Callable[[str], None]
) -> AOTDecodeStep | None:
    """Set ``model``'s decode step for ``mode`` (see the module docstring) and return it (None:
    eager). ``notice`` receives the one line a user should see: that a background build
    started, or a ``warning:`` that the compiled step failed and decoding stays eager. For
    "compiled" the caller calls the step's ``prepare()`` (the build or load, before the first
    token: the CLI shows a spinner meanwhile)."""
    import torch

    from clearlm.runtime.aot import compile_decode_aot, failed_path, spawn_build

    if mode == "eager":
        return None
    if model.config.n_experts:  # a data-dependent loop over experts: no static decode graph
        if mode == "compiled":
            notice("warning: a mixture-of-experts model decodes eagerly (its experts are "
                   "chosen per token, which the compiled step cannot capture)")
        return None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if mode == "compiled":
            notice("warning: the compiled decode step runs in one process; a tensor- or "
                   "pipeline-parallel run decodes eagerly")
        return None

    def eager(e: Exception) -> None:
        notice(f"warning: {e}; decoding eagerly")

    def start(path: Any) -> None:
        failed = failed_path(path)
        if failed.exists():
            why = (failed.read_text(errors="replace").strip().splitlines() or ["unknown"])[-1]
            notice(f"warning: the compiled decode step failed to build before ({why[:160]}); "
                   f"decoding eagerly; `clearlm compile {model.path}` tries again")
            return
        log = spawn_build(path, compile_argv(model))
        notice("building the compiled decode step in the background (1-3 minutes, once for "
               f"this model and these options; log {log}); decoding eagerly until it is ready")

    return compile_decode_aot(model.transformer, on_error=eager,
                              start_build=start if mode == "auto" else None)


def attach_batch_decode(
    model: Any, mode: str, notice: Callable[[str], None]
) -> BatchDecodeStep | None:
    """The serving engine's compiled step (:mod:`clearlm.runtime.aot_batch`), as
    :func:`attach_decode` sets the one-row step: sets ``model.transformer.batch_decode_fn``
    for ``mode`` and returns the step (None: eager). "auto" builds a package not on disk with
    ``clearlm compile --batch`` in a background process (the engine decodes eagerly until it
    appears); "compiled": the caller calls ``prepare()`` before serving. ``notice`` gets the
    line to show (a background build started, or a ``warning:`` that decoding stays eager)."""
    import torch

    from clearlm.runtime.aot import failed_path, spawn_build
    from clearlm.runtime.aot_batch import compile_batch_decode

    if mode == "eager":
        return None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        notice("warning: the compiled batched step runs in one process; a tensor- or "
               "pipeline-parallel server decodes eagerly")
        return None

    def eager(e: Exception) -> None:
        notice(f"warning: {e}; the server decodes eagerly")

    def start(path: Any) -> None:
        failed = failed_path(path)
        if failed.exists():
            why = (failed.read_text(errors="replace").strip().splitlines() or ["unknown"])[-1]
            notice(f"warning: the compiled batched step failed to build before ({why[:160]}); "
                   f"the server decodes eagerly; `clearlm compile --batch {model.path}` tries "
                   "again")
            return
        log = spawn_build(path, [*compile_argv(model), "--batch"])
        notice("building the compiled batched decode step in the background (2-5 minutes, "
               f"once for this model and these options; log {log}); decoding eagerly until it is "
               "ready")

    step = compile_batch_decode(model.transformer, on_error=eager,
                                start_build=start if mode == "auto" else None)
    if mode == "auto" and not step.ready():  # start it (or warn) now, not at the first request
        step.started = True
        start(step.package_path())
    return step
