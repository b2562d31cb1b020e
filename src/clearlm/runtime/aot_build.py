"""What the ahead-of-time decode step exports and how it is compiled (clearlm.runtime.aot loads it).

The exported program is the eager forward of one decode step (``_Step``): token (1, 1),
the cache lengths, the RoPE tables and the KV cache buffers in, logits out, the cache written in
place. The RoPE tables are inputs, not constants: while exporting, each RotaryEmbedding is
replaced by a stand-in that looks rows up in the tables it is given (``tables_as_inputs``), so
the package serves tables of any length (a dynamic dimension) and holds no copy of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from clearlm.model.kv_cache import KVCache
from clearlm.model.positions import RotaryEmbedding
from clearlm.quant.kernels import load_kernels

MIN_COLUMNS = 3  # smallest cache key axis (S_max + 1) a package takes


class AOTError(RuntimeError):
    """The decode step could not be exported or compiled for this model (the message says why)."""


_ROPE_ATTRS = ("rope", "rope_local")  # the Transformer's RotaryEmbedding modules (or None)


def _ropes(net: torch.nn.Module) -> list[tuple[str, RotaryEmbedding]]:
    """(attribute, module) of each RotaryEmbedding the model has: full layers', sliding's."""
    return [(a, r) for a in _ROPE_ATTRS if isinstance(r := getattr(net, a, None), RotaryEmbedding)]


def rope_tables(net: torch.nn.Module) -> list[torch.Tensor]:
    """The RoPE tables the step takes as inputs: cos, sin_rot of each rope, (P, d) float32."""
    return [t for _, r in _ropes(net) for t in (r.cos, r.sin_rot)]


def named_tensors(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer under the names the exported program gives them ("net." +
    the module path; tied tensors under each of their names), but the RoPE tables (inputs)."""
    tables = {id(t) for t in rope_tables(net)}
    out = {f"net.{k}": v for k, v in net.named_parameters(remove_duplicate=False)}
    out.update({f"net.{k}": v for k, v in net.named_buffers(remove_duplicate=False)
                if id(v) not in tables})
    return out


class _TableRows(torch.nn.Module):
    """Stands in for a RotaryEmbedding while the step is exported: the rows of tables the step
    was given as inputs (RotaryEmbedding.forward's lookup, without the buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.cos: torch.Tensor | None = None
        self.sin_rot: torch.Tensor | None = None

    def forward(self, positions: torch.Tensor, bound: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.cos is not None and self.sin_rot is not None
        return self.cos[positions], self.sin_rot[positions]  # (T, d) or (B, T, d) each


class _Step(torch.nn.Module):
    """What is exported: forward(token (1, 1) int64, lengths (1,) int64, *tables, *keys,
    *values) → logits (1, V); tables: cos, sin_rot (P, d) of each rope (:func:`rope_tables`);
    keys/values (1, K, S_max + 1, Hd) per layer, written in place.

    Built inside :func:`tables_as_inputs`, whose stand-ins take the tables in forward."""

    def __init__(self, net: torch.nn.Module, rows: list[_TableRows]) -> None:
        super().__init__()
        self.net, self.n_layers, self.rows = net, len(net.layers), rows

    def forward(self, token: torch.Tensor, lengths: torch.Tensor, *rest: torch.Tensor
                ) -> torch.Tensor:
        n, r = self.n_layers, 2 * len(self.rows)
        tables, kv = rest[:r], rest[r:]
        for i, rows in enumerate(self.rows):
            rows.cos, rows.sin_rot = tables[2 * i], tables[2 * i + 1]
        cache = KVCache.from_buffers(list(kv[:n]), list(kv[n:]), lengths)
        try:
            return self.net(token, cache=cache, last_only=True)[:, -1, :]
        finally:  # no tensor left on a module: export checks that none was assigned
            for rows in self.rows:
                rows.cos = rows.sin_rot = None


@contextlib.contextmanager
def tables_as_inputs(net: torch.nn.Module) -> Iterator[list[_TableRows]]:
    """While exporting: each RotaryEmbedding of ``net`` replaced by a _TableRows (so that its
    tables are not constants of the program), put back afterwards."""
    ropes = _ropes(net)
    rows = [_TableRows() for _ in ropes]
    try:
        for (attr, _), stand_in in zip(ropes, rows, strict=True):
            setattr(net, attr, stand_in)
        yield rows
    finally:
        for attr, rope in ropes:
            setattr(net, attr, rope)


def max_columns(net: torch.nn.Module) -> int:
    """Largest cache key axis (S_max + 1) a package takes: the context length + 1."""
    return net.config.context_length + 1


def build_package(net: torch.nn.Module, path: Path) -> None:
    """Export the decode step of ``net`` and compile it into the package ``path`` (written to a
    temporary name, then renamed: a package on disk is always whole). Raises AOTError."""
    c = net.config
    if getattr(getattr(net, "rope", None), "dynamic", False):
        raise AOTError("dynamic RoPE scaling reads positions back to the host in every step")
    cols = max(MIN_COLUMNS, min(16, max_columns(net)))
    cache = net.new_cache(1, cols - 1)  # an example input; the key axis stays symbolic
    token = torch.zeros(1, 1, dtype=torch.long, device=net.device)
    tables = rope_tables(net)
    args = (token, cache.lengths, *tables, *cache.keys, *cache.values)
    s = torch.export.Dim("cache_columns", min=MIN_COLUMNS, max=max_columns(net))
    # each rope's two tables share a length (built together); any length from 2 rows up
    p = [torch.export.Dim(f"rope{i}_positions", min=2, max=c.context_length)
         for i in range(len(tables) // 2)]
    dynamic = (None, None, tuple({0: p[i // 2]} for i in range(len(tables)))
               + tuple({2: s} for _ in range(2 * c.n_layers)))
    with tables_as_inputs(net) as rows:
        export_and_package(_Step(net, rows), args, dynamic, path)


def export_and_package(step: torch.nn.Module, args: tuple, dynamic: tuple, path: Path) -> None:
    """Export ``step`` (a module that takes the RoPE tables as inputs, built inside
    :func:`tables_as_inputs`) on the example ``args`` with the ``dynamic`` shapes, and compile
    it into the package ``path`` (a temporary name, then renamed: a package on disk is always
    whole; its checksum written first). Raises AOTError."""
    import torch._inductor  # the build needs Inductor; loading a package does not

    from clearlm.runtime.compiled import DECODE_INDUCTOR, _use_cache_dir

    _use_cache_dir()  # Inductor's intermediate files in clearlm's cache too
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.pt2")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)  # before the export: fail in ms, not 10 s
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations, not ours
            program = torch.export.export(step.eval(), args, dynamic_shapes=dynamic, strict=False)
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(tmp),
                # the weights stay out; loops read the thread count when they run (not one
                # package per --threads: 0-3 % slower per step than a fixed count, measured)
                inductor_configs={"aot_inductor.package_constants_in_so": False,
                                  "cpp.dynamic_threads": True, **DECODE_INDUCTOR,
                                  **kernel_shims()},
            )
        checksum_path(path).write_text(digest_of(tmp))  # read back before every load
        os.replace(tmp, path)
    except Exception as e:  # torch's export and compile errors have no common base class
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AOTError(f"cannot compile the decode step ahead of time: {first}") from e
    finally:  # also on Ctrl-C: no half-written file left behind
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


# The C++ kernel's operators as AOTInductor C shims (csrc/qgemv_ops.cpp): the package calls
# them directly instead of through its proxy executor.
_SHIM = ("AOTITorchError aoti_torch_cpu_{}(AtenTensorHandle x, AtenTensorHandle codes, "
         "AtenTensorHandle scale, AtenTensorHandle mn, int64_t bits, int64_t bs, "
         "AtenTensorHandle* ret0)")
_HALF_SHIM = ("AOTITorchError aoti_torch_cpu_hmm(AtenTensorHandle x, AtenTensorHandle w, "
              "AtenTensorHandle* ret0)")  # F16 / BF16 weights (csrc/qgemv_half.cpp)
_DEQUANT_SHIM = ("AOTITorchError aoti_torch_cpu_dequant(AtenTensorHandle codes, "
                 "AtenTensorHandle scale, AtenTensorHandle mn, int64_t bits, int64_t bs, "
                 "AtenTensorHandle* ret0)")  # K-quant or IQ4 embedding rows (quant/embedding.py)


def kernel_shims() -> dict:
    """Inductor's config for the kernel's C shims, or {} without the kernel."""
    if load_kernels() is None:
        return {}
    ops = torch.ops.clearlm_kernels
    return {"aot_inductor.custom_ops_to_c_shims": {
        ops.qmm.default: [_SHIM.format("qmm")], ops.qmm_i8.default: [_SHIM.format("qmm_i8")],
        ops.hmm.default: [_HALF_SHIM], ops.dequant.default: [_DEQUANT_SHIM]}}


def checksum_path(path: Path) -> Path:
    """Where the sha256 of the package ``path`` is written (checked before every load)."""
    return path.with_name(path.name + ".sha256")


def digest_of(path: Path) -> str:
    """sha256 of a file's bytes, 64 hex characters."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
