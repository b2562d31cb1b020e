"""A ``torch.compile``d decode step: one new token per sequence against the KV cache.

``CompiledDecodeStep(model)`` is a drop-in for ``generation.decode_step``: called as
``step(model, token, cache)`` (token (B, 1) int64 → logits (B, V) float32) it runs the same
forward pass compiled by Inductor (fused elementwise ops, no per-op Python dispatch), with the
compact layers' kernel as one opaque node each (clearlm.quant.ops, a torch custom op). The eager
model stays as it is: prefill, tracing and every call while a hook point is active (a hook or a
recording) take the eager path, so hooks always see every value.

Shapes: static. The step reads the whole preallocated cache (S_max + 1 key columns, masked by
position: clearlm.model.kv_cache), writes the new key at its position tensor and moves the lengths
with
tensor ops, so nothing is read back to Python and one graph (``fullgraph=True``) serves every
position of a generation; a cache of another size compiles another graph (Dynamo's guards).
The context-length check is the caller's (generation.check_fits sizes the cache).

Compile cache: Inductor's FX-graph and AOT-autograd caches are on by default in torch 2.13; they
are pointed at ``$CLEARLM_CACHE/inductor`` (default ``~/.cache/clearlm/inductor``) unless
``TORCHINDUCTOR_CACHE_DIR`` is set, so a second process reuses the compiled code (Dynamo still
re-traces the Python, which is most of what remains; see the README for measured times).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch._inductor
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from clearlm.model.hooks import HookPoint
from clearlm.model.kv_cache import KVCache
from clearlm.quant.linear import QuantLinear
from clearlm.store.catalog import default_cache_dir as clearlm_cache_dir

DYNAMO_CONFIG = {"recompile_limit": 16}  # a few cache sizes per process before falling back
# Inductor's Python wrapper checks the size, stride and alignment of every input and every
# kernel output on each call (some 700 checks per SmolLM2 step); without them the step takes
# 0.5 ms less CPU (22.5 -> 22.0 ms, 1 thread). Wrong strides would show up as wrong logits, which
# tests/runtime/test_compiled.py compares with the eager step's.
CHECKS_OFF = {"size_asserts": False, "alignment_asserts": False}
# A pointwise value read by a reduction is computed into a buffer of its own when its formula
# reads more than this many values (Inductor's CPU default: 12), not recomputed inside the
# reduction's loop. The one-query attention (model.attention.attend_one_query) needs it: Gemma
# 3's q (q-norm and RoPE, 7 reads) was recomputed for every key of the cache, and its step took
# 6 % longer than with two matrix products; with it, 2-3 % shorter (AOT packages, 2 threads,
# one process, steps alternating: bench notes in the README).
DECODE_INDUCTOR = {"realize_acc_reads_threshold": 4}
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def cache_dir() -> Path:
    """Where Inductor keeps compiled graphs: TORCHINDUCTOR_CACHE_DIR where the user set it, else
    ``$CLEARLM_CACHE/inductor`` (default ``~/.cache/clearlm/inductor``).

    Importing torch._inductor sets TORCHINDUCTOR_CACHE_DIR to torch's default (a folder under
    /tmp) when it is unset, so that value counts as unset here."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env and os.path.abspath(env) != os.path.abspath(default_cache_dir()):
        return Path(env)
    return clearlm_cache_dir() / "inductor"


def _use_cache_dir() -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir())  # read by Inductor at each use


def _forward(model: torch.nn.Module, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The decode step's body: token (B, 1) → logits (B, V) (what gets compiled)."""
    return model(token, cache=cache, last_only=True)[:, -1, :]


class CompiledDecodeStep:
    """``step(model, token, cache)`` → logits (B, V): generation.decode_step, compiled.

    Args:
        model: the Transformer (float32 or compact layers) the step is for.
        mode: torch.compile mode ("default" or "max-autotune-no-cudagraphs"; see MODES).
        fullgraph: demand one graph (the default; raises at the first call if the forward has a
            graph break). False lets Dynamo split the step where it must.
        cpp_wrapper: Inductor's C++ wrapper (the default) instead of its Python wrapper: the
            graph's ~300 kernel calls without Python between them, ~6 % faster per step (2
            threads, one process, alternating, medians of 40–60 rounds: SmolLM2 12.1 vs 12.9
            ms, Gemma 3 270M 21.8 vs 23.1 ms), at about twice the first compile time.

    Attributes after the first call: ``compile_s`` and ``compile_cpu_s`` (wall and CPU seconds
    the first call took, compile included). Calls while a hook point is active, or for another
    model, run eagerly.

    Guards: Dynamo checks ~490 tensor guards (every parameter's dtype, shape and strides) and
    the module attributes before each call to pick the compiled graph: 0.8–1.5 ms per step
    on this CPU.
    A call whose inputs were seen before (:meth:`key`: the token's shape, strides and kind, the
    cache's shapes, the compact layers' int8 switches, the matmul precision) skips them
    (``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``); any other call runs them all
    and may compile a new graph, and so does a skipped call that Dynamo still finds would need
    another graph (it says so before running anything).
    """

    def __init__(self, model: torch.nn.Module, mode: str = "default", fullgraph: bool = True,
                 cpp_wrapper: bool = True) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        _use_cache_dir()
        self.model = model
        self.points = [m for m in model.modules() if isinstance(m, HookPoint)]
        self.switches = [m for m in model.modules() if isinstance(m, QuantLinear)]
        options = {**torch._inductor.list_mode_options(mode), **CHECKS_OFF, **DECODE_INDUCTOR}
        if cpp_wrapper:
            options["cpp_wrapper"] = True
        self.fn = torch.compile(_forward, fullgraph=fullgraph, options=options)
        self.seen: set[tuple] = set()
        self.compile_s: float | None = None
        self.compile_cpu_s: float | None = None

    def hooks_active(self) -> bool:
        return any(p.active for p in self.points)

    def key(self, token: torch.Tensor, cache: KVCache) -> tuple:
        """What, besides the model itself, decides which compiled graph a call needs."""
        k0 = cache.keys[0]
        return (tuple(token.shape), token.stride(), token.dtype, token.device,
                token.is_inference(), tuple(k0.shape), k0.dtype, len(cache.keys),
                tuple(m.int8 for m in self.switches), torch.get_float32_matmul_precision())

    @torch.inference_mode()
    def __call__(self, model: torch.nn.Module, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        if model is not self.model or self.hooks_active():
            return _forward(model, token, cache)  # eager: hooks see every value
        key = self.key(token, cache)
        if key in self.seen:
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self.fn(model, token, cache)
            except RuntimeError as e:  # Dynamo found its graph unfit before running it
                if "skip_guard_eval_unsafe" not in str(e):
                    raise
                self.seen.discard(key)
        with torch._dynamo.config.patch(DYNAMO_CONFIG):
            t, c = time.perf_counter(), time.process_time()
            out = self.fn(model, token, cache)
            if self.compile_s is None:
                self.compile_s = time.perf_counter() - t
                self.compile_cpu_s = time.process_time() - c
        if len(self.seen) < DYNAMO_CONFIG["recompile_limit"]:  # past it Dynamo may run eagerly
            self.seen.add(key)
        return out


def compile_decode(model: Any, mode: str = "default", fullgraph: bool = True,
                   cpp_wrapper: bool = True) -> CompiledDecodeStep:
    """Make generation (``generation.generate_step``, hence ``Model.generate`` / ``chat`` and
    ``CLEARLM_COMPILE=jit clearlm generate --compile``) decode with a compiled step: ``model``
    is a ``clearlm.Model`` or its Transformer; sets the Transformer's ``decode_fn``. The compile
    happens at the first decode step (seconds to a minute; cached for the next process)."""
    net = getattr(model, "transformer", model)
    step = CompiledDecodeStep(net, mode, fullgraph, cpp_wrapper)
    net.decode_fn = step
    return step
