"""The continuous-batching engine's decode step, compiled ahead of time (``clearlm serve``).

``BatchDecodeStep(model)`` is the engine's ``batch_decode_fn`` (clearlm.engine.scheduler): called
as ``step(model, tokens, positions, cache, n_keys)`` it runs the engine's decode pass (tokens
(B, 1) int64 at positions (B, 1) int64, −1 for a padding row, in the cache slots [0, B), reading
keys [0, n_keys)) through an AOTInductor package, and returns logits (B, V) float32; or None
when the package cannot serve the call (the engine then runs the same pass eagerly).

One package serves every row count from 1 to ROWS and every key count: the exported program's
batch axis and its key axis are dynamic dimensions (``torch.export.Dim``), so a step with r
rows runs r rows, with no padding to a bucket and no graph compiled while serving (an AOT
package never recompiles; a torch.compile step with a fixed bucket set would compile one graph
per bucket and key bucket). What is exported (``_RowsStep``) is the eager forward the engine
runs, taking as inputs: the tokens, the positions, a tensor whose length is n_keys (the key
axis read back, a multiple of the engine's key bucket, so the step never reads the unfilled
columns of a 2,048-position slot), the slots' lengths and the KV buffers of slots [0, B)
(``keys[layer][:B]``: a contiguous view, written in place; the scratch column S_max, which
padding rows write, stays inside it). ROWS is the compact kernel's row limit
(clearlm.quant.linear.SMALL_M): past it compact layers dequantize, and steps of more rows run
eagerly.

Building, loading, checksums, the ``.failed`` marker and the background build are those of
clearlm.runtime.aot (this step is an AOTDecodeStep with another program); the package is
``decode-rows-<key>.pt2`` beside the single-row one, built by ``clearlm compile --batch``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from clearlm.model.kv_cache import KVCache
from clearlm.quant.linear import SMALL_M
from clearlm.runtime.aot import AOTDecodeStep, package_key
from clearlm.runtime.aot_build import (
    MIN_COLUMNS,
    AOTError,
    _TableRows,
    export_and_package,
    max_columns,
    rope_tables,
    tables_as_inputs,
)

ROWS = SMALL_M  # most rows a package takes (the compact kernel's limit)


class _RowsStep(torch.nn.Module):
    """What is exported: forward(tokens (B, 1), positions (B, 1), span (n_keys,), lengths (B,),
    *tables, *keys, *values) → logits (B, V); keys/values (B, K, S_max + 1, Hd) per layer,
    written in place; only span's length is read (the keys attention reads back)."""

    def __init__(self, net: torch.nn.Module, rows: list[_TableRows]) -> None:
        super().__init__()
        self.net, self.n_layers, self.rows = net, len(net.layers), rows

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, span: torch.Tensor,
                lengths: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        n, r = self.n_layers, 2 * len(self.rows)
        tables, kv = rest[:r], rest[r:]
        for i, rows in enumerate(self.rows):
            rows.cos, rows.sin_rot = tables[2 * i], tables[2 * i + 1]
        cache = KVCache.from_buffers(list(kv[:n]), list(kv[n:]), lengths)
        n_keys = span.shape[0]
        torch._check(n_keys <= kv[0].shape[2] - 1)  # never past S_max (the caller's check)
        try:
            return self.net(tokens, positions, cache=cache, last_only=True,
                            n_keys=n_keys)[:, -1, :]
        finally:  # no tensor left on a module: export checks that none was assigned
            for rows in self.rows:
                rows.cos = rows.sin_rot = None


def build_rows_package(net: torch.nn.Module, path: Path) -> None:
    """Export the engine's decode pass of ``net`` for 1..ROWS rows and any key count, and
    compile it into the package ``path``. Raises AOTError."""
    c = net.config
    if getattr(getattr(net, "rope", None), "dynamic", False):
        raise AOTError("dynamic RoPE scaling reads positions back to the host in every step")
    cols = max(MIN_COLUMNS + 1, min(16, max_columns(net)))
    cache = net.new_cache(2, cols - 1)  # example inputs: 2 rows (1 would be specialised)
    dev = net.device
    tokens = torch.zeros(2, 1, dtype=torch.long, device=dev)
    positions = torch.tensor([[1], [-1]], device=dev)  # a decode row and a padding row
    span = torch.zeros(cols - 2, dtype=torch.long, device=dev)
    tables = rope_tables(net)
    args = (tokens, positions, span, cache.lengths, *tables, *cache.keys, *cache.values)
    b = torch.export.Dim("rows", min=1, max=ROWS)
    s = torch.export.Dim("cache_columns", min=MIN_COLUMNS, max=max_columns(net))
    k = torch.export.Dim("keys_read", min=1, max=max_columns(net) - 1)
    p = [torch.export.Dim(f"rope{i}_positions", min=2, max=c.context_length)
         for i in range(len(tables) // 2)]
    rest = (tuple({0: p[i // 2]} for i in range(len(tables)))  # *rest: one entry
            + tuple({0: b, 2: s} for _ in range(2 * c.n_layers)))
    dynamic = ({0: b}, {0: b}, {0: k}, {0: b}, rest)
    with tables_as_inputs(net) as rows:
        export_and_package(_RowsStep(net, rows), args, dynamic, path)


class BatchDecodeStep(AOTDecodeStep):
    """``step(model, tokens, positions, cache, n_keys)`` → logits (B, V) float32, or None where
    the package cannot serve the call (see the module docstring); the engine's decode pass,
    compiled ahead of time. Arguments and attributes: :class:`~clearlm.runtime.aot.AOTDecodeStep`'s
    (``prepare()`` builds or loads the package before serving; ``start_build`` builds it in
    another process while the engine decodes eagerly)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.span = torch.empty(self.max_columns, dtype=torch.long, device=self.model.device)

    def package_path(self) -> Path:
        if self._path is None:
            self._path = self.directory / f"decode-rows-{package_key(self.model)}.pt2"
        return self._path

    def build(self, path: Path) -> None:
        build_rows_package(self.model, path)

    def serves_rows(self, model: torch.nn.Module, tokens: torch.Tensor, cache: KVCache,
                    n_keys: int) -> bool:
        """Whether the package can run this decode pass (else the engine runs it eagerly)."""
        if len(cache.keys) != self.model.config.n_layers or cache.keys[0].dim() != 4:
            return False
        k0 = cache.keys[0]
        B = tokens.shape[0]
        short = any(len(t) < k0.shape[2] - 1 for t in rope_tables(self.model))
        return (model is self.model and not any(p.active for p in self.points) and not short
                and 1 <= B <= min(ROWS, cache.n_slots) and tuple(tokens.shape) == (B, 1)
                and tokens.dtype == torch.long and 1 <= n_keys <= cache.max_seq_len
                and MIN_COLUMNS <= k0.shape[2] <= self.max_columns
                and k0.dtype == self.cache_dtype and k0.device == self.model.device)

    @torch.inference_mode()
    def __call__(self, model: torch.nn.Module, tokens: torch.Tensor,  # type: ignore[override]
                 positions: torch.Tensor, cache: KVCache, n_keys: int) -> torch.Tensor | None:
        if self.failed or not self.serves_rows(model, tokens, cache, n_keys):
            return None
        if self.loader is None and self._building_elsewhere():
            return None  # eager meanwhile
        if self.loader is None:
            self._prepare()
        if self.loader is None:
            return None
        B, dev = tokens.shape[0], self.model.device
        tables = rope_tables(self.model)  # (P, d) each
        keys = [k[:B] for k in cache.keys]  # (B, K, S_max + 1, Hd): contiguous views
        values = [v[:B] for v in cache.values]
        # boxed_run lets go of the GIL while the step runs (run holds it throughout: the
        # server's event loop, which streams the tokens and takes new requests, stood still for
        # every step, and time to first token doubled); it empties the list it is given
        inputs = [tokens.to(dev), positions.to(dev), self.span[:n_keys], cache.lengths[:B],
                  *tables, *keys, *values]
        return self.loader.boxed_run(inputs)[0]


def compile_batch_decode(model: torch.nn.Module, directory: Path | None = None,
                         on_error: Callable[[AOTError], None] | None = None,
                         start_build: Callable[[Path], None] | None = None) -> BatchDecodeStep:
    """Make the continuous-batching engine (``clearlm serve``, clearlm.engine.scheduler) decode
    through the compiled batch step: sets the Transformer ``model``'s ``batch_decode_fn``
    (arguments as :func:`clearlm.runtime.aot.compile_decode_aot`)."""
    net = getattr(model, "transformer", model)
    step = BatchDecodeStep(net, directory, on_error, start_build)
    net.batch_decode_fn = step
    return step
