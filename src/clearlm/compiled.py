"""A ``torch.compile``d decode step: one new token per sequence against the KV cache.

``CompiledDecodeStep(model)`` is a drop-in for ``generation.decode_step``: called as
``step(model, token, cache)`` (token (B, 1) int64 → logits (B, V) float32) it runs the same
forward pass compiled by Inductor (fused elementwise ops, no per-op Python dispatch), with the
compact layers' kernel as one opaque node each (clearlm.quant.ops, a torch custom op). The eager
model stays as it is: prefill, tracing and every call while a hook point is active (a hook or a
recording) take the eager path, so hooks always see every value.

Shapes: the batch and the one-token step are static; the cache length grows by one each step,
so Dynamo treats it as a dynamic size after its first recompile (one graph serves every
position). Until the forward pass stops reading positions on the host (``int(positions[-1])``
in the context check and the attention mask), those reads split the step into several graphs
(graph breaks, ``fullgraph=False``): still compiled, with some Python between the pieces.

Compile cache: Inductor's FX-graph and AOT-autograd caches are on by default in torch 2.13; they
are pointed at ``$CLEARLM_CACHE/inductor`` (default ``~/.cache/clearlm/inductor``) unless
``TORCHINDUCTOR_CACHE_DIR`` is set, so a second process reuses the compiled code (Dynamo still
re-traces the Python, which is most of what remains; see the README for measured times).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from clearlm.kv_cache import KVCache
from clearlm.model.hooks import HookPoint

# Layer indices (an int per attention module) stay symbolic, so the frames that a graph break
# leaves per layer share one compiled graph instead of one each (and the recompile limit).
DYNAMO_CONFIG = {"allow_unspec_int_on_nn_module": True, "recompile_limit": 64}
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


def cache_dir() -> Path:
    """Where Inductor keeps compiled graphs (TORCHINDUCTOR_CACHE_DIR if set)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        return Path(env)
    root = Path(os.environ.get("CLEARLM_CACHE", Path.home() / ".cache" / "clearlm"))
    return root / "inductor"


def _use_cache_dir() -> None:
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir()))


def _forward(model: torch.nn.Module, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The decode step's body: token (B, 1) → logits (B, V) (what gets compiled)."""
    return model(token, cache=cache, last_only=True)[:, -1, :]


class CompiledDecodeStep:
    """``step(model, token, cache)`` → logits (B, V): generation.decode_step, compiled.

    Args:
        model: the Transformer (float32 or compact layers) the step is for.
        mode: torch.compile mode ("default" or "max-autotune-no-cudagraphs"; see MODES).
        fullgraph: demand one graph (raises at the first call if the forward has a graph break).
        cpp_wrapper: Inductor's C++ wrapper instead of its Python wrapper (less per-call Python).

    Attributes after the first call: ``compile_s`` (seconds the first call took, compile
    included). Calls while a hook point is active, or for another model, run eagerly.
    """

    def __init__(self, model: torch.nn.Module, mode: str = "default", fullgraph: bool = False,
                 cpp_wrapper: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        _use_cache_dir()
        self.model = model
        self.points = [m for m in model.modules() if isinstance(m, HookPoint)]
        options = {"cpp_wrapper": True} if cpp_wrapper else None
        kwargs = {"options": options} if options else {"mode": None if mode == "default" else mode}
        self.fn = torch.compile(_forward, fullgraph=fullgraph, **kwargs)
        self.compile_s: float | None = None

    def hooks_active(self) -> bool:
        return any(p.active for p in self.points)

    @torch.inference_mode()
    def __call__(self, model: torch.nn.Module, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        if model is not self.model or self.hooks_active():
            return _forward(model, token, cache)  # eager: hooks see every value
        with torch._dynamo.config.patch(DYNAMO_CONFIG):
            if self.compile_s is None:
                t = time.perf_counter()
                out = self.fn(model, token, cache)
                self.compile_s = time.perf_counter() - t
                return out
            return self.fn(model, token, cache)


def compile_decode(model: torch.nn.Module, mode: str = "default", fullgraph: bool = False,
                   cpp_wrapper: bool = False) -> CompiledDecodeStep:
    """Make generation (``generation.generate_step``, hence ``Model.generate`` / ``chat`` and the
    CLI's ``--compile``) decode with a compiled step: sets ``model.decode_fn``. The compile
    happens at the first decode step (seconds to a minute; cached for the next process)."""
    step = CompiledDecodeStep(model, mode, fullgraph, cpp_wrapper)
    model.decode_fn = step
    return step
