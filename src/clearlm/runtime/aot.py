"""An ahead-of-time compiled decode step (AOTInductor): built once per model shape, then loaded
in milliseconds by every later process.

``AOTDecodeStep(model)`` is a drop-in for ``generation.decode_step`` (``step(model, token,
cache)``: token (1, 1) int64 → logits (1, V) float32), like clearlm.runtime.compiled's torch.compile
step, but compiled ahead of time: ``torch.export`` captures the same eager forward (the compact
layers' kernel as one custom-op node each, clearlm.quant.ops; the KV cache written in place),
``torch._inductor.aoti_compile_and_package`` turns it into a shared library packaged as a .pt2
file, and ``torch._C._aoti.AOTIModelPackageLoader`` runs it. Against the torch.compile step:
- no Dynamo at run time: no guards before each call (~1 ms a step) and torch._dynamo,
  torch._inductor and sympy are never imported by a process that only loads a package (about
  110 MiB of RSS they cost, and the 10 s a cached torch.compile still re-traces);
- the weights are not in the package: it is compiled with ``package_constants_in_so=False``
  and reads the model's own parameters and buffers (``load_constants(..., user_managed=True)``),
  so they are held once, and one package serves every model file of the same shapes;
- one package serves every cache size: the cache's key axis is a dynamic dimension
  (``torch.export.Dim``) from MIN_COLUMNS to the context length + 1, and the RoPE tables are
  inputs of the step, not constants (their length a dynamic dimension too): the step reads the
  tables eager decode reads, which each cache's creation sizes to its length, so a short
  generation holds short tables (Gemma 3 at head_dim 256: 4 MiB for 1,024 positions, where
  tables fixed at 4,096 positions held 16 MiB).

Measured (SmolLM2-135M compact, 2 threads, same process, alternating, medians of 200 steps,
128-position cache): eager 16.8 ms, torch.compile step 10.3 ms, this step 8.1 ms per token;
building the package ~1.5–2.5 min on 2 cores (export ~6 s, the rest Inductor and the C++
compiler); loading it 4–9 ms and +1 MiB of RSS. Logits within 3.2e-5 of the eager step's.

Packages live in ``$CLEARLM_CACHE/aot`` (default ``~/.cache/clearlm/aot``), named by a digest of
what the compiled code depends on (:func:`package_key`): the clearlm source a step runs, torch's
version, the CPU's vector ISA, the model's config, device and the names, shapes, dtypes and
strides of its tensors, whether the C++ kernel is there, the compact layers' int8 switches. The
thread count is read when the step runs (Inductor's ``cpp.dynamic_threads``), so one package
serves every ``--threads``. A checksum written beside each package is checked before loading.

Calls the package cannot serve run the eager step instead (same values): hooks active, another
model, a batch of more than one row, a cache size outside the package's range, another dtype
or device. The context-length check is the caller's (generation.check_fits sizes the cache).

Building in the background (the CLI's and the API's default): with ``start_build``, a step whose
package is not built yet starts the build elsewhere (``clearlm compile`` in a process of its own,
:func:`spawn_build`) and decodes eagerly meanwhile; the package appears on disk in one rename
(its checksum written first), and the next step after that loads it (milliseconds) and runs
compiled. No answer ever waits for a build. A build that failed leaves ``<package>.failed``
(its error), so later runs decode eagerly with one warning instead of building again; ``clearlm
compile MODEL`` retries. Concurrent builds of one package are kept to one by ``<package>.lock``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from clearlm.model.hooks import HookPoint
from clearlm.model.kv_cache import KVCache
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import QuantLinear
from clearlm.runtime.aot_build import (
    MIN_COLUMNS,
    AOTError,
    build_package,
    checksum_path,
    digest_of,
    max_columns,
    named_tensors,
    rope_tables,
)
from clearlm.store.catalog import default_cache_dir

_SOURCE = Path(__file__).resolve().parents[1]  # the clearlm package: its code is in the key
# ... except what a decode step never runs (so editing the CLI or the server keeps packages);
# anything new is in the key until it is named here
_NOT_TRACED = ("cli/", "serve/", "ui/", "inspect/", "tokenizer/", "engine/", "api/", "store/",
               "sampling/", "generation/", "text.py", "__main__.py")


def cache_root() -> Path:
    """``$CLEARLM_CACHE/aot`` (default ``~/.cache/clearlm/aot``): where packages are kept."""
    return default_cache_dir() / "aot"


def _code_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(_SOURCE.rglob("*")):
        name = f.relative_to(_SOURCE).as_posix()
        if f.suffix in (".py", ".cpp") and f.is_file() and not name.startswith(_NOT_TRACED):
            h.update(name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def package_key(net: torch.nn.Module) -> str:
    """Digest naming a model's package: code, torch, CPU ISA, config, device, whether
    the C++ kernel is there, tensor layout (names, shapes, dtypes, strides) and int8 switches;
    24 hex characters."""
    h = hashlib.sha256()
    parts = [_code_digest(), torch.__version__, torch.backends.cpu.get_cpu_capability(),
             repr(net.config), str(net.device),
             str(getattr(net, "matmul_precision", "highest")),
             str(load_kernels() is not None)]  # without the kernel: torch's (slow) fallback ops
    for name, t in named_tensors(net).items():  # not the RoPE tables: inputs of any length
        parts.append(f"{name}:{tuple(t.shape)}:{t.stride()}:{t.dtype}")
    parts += [str(m.int8) for m in net.modules() if isinstance(m, QuantLinear)]
    for p in parts:
        h.update(p.encode() + b"\0")
    return h.hexdigest()[:24]


class AOTDecodeStep:
    """``step(model, token, cache)`` → logits (1, V): generation.decode_step, compiled ahead of
    time (see the module docstring).

    Args:
        model: the Transformer (float32 or compact layers) the step is for.
        directory: where packages are looked for and written (default :func:`cache_root`).
        on_error: called with the AOTError when the package cannot be built or loaded, after
            which every call runs eagerly (the CLI warns and goes on); None raises it.

    Attributes after the first call the package serves: ``path`` (the package), ``compile_s``
    (wall seconds that call spent building or loading it), ``built`` (True when this process
    compiled it, False when it was loaded from disk), ``max_columns`` (the largest cache key
    axis it takes).

    Raises (at the first call the package serves): AOTError when the step cannot be exported or
    compiled; a package that exists but does not fit the model (a constant missing) raises it
    too.
    """

    def __init__(self, model: torch.nn.Module, directory: Path | None = None,
                 on_error: Callable[[AOTError], None] | None = None,
                 start_build: Callable[[Path], None] | None = None) -> None:
        self.model, self.directory, self.on_error = model, directory or cache_root(), on_error
        self.start_build, self.started = start_build, False
        self._path: Path | None = None  # the package_key digest reads every tensor: once
        self.failed = False
        self.points = [m for m in model.modules() if isinstance(m, HookPoint)]
        self.cache_dtype = model.new_cache(1, 1).keys[0].dtype  # the keys' dtype it is built for
        self.path: Path | None = None
        self.max_columns = max_columns(model)
        self.loader = None
        self.constants: dict[str, torch.Tensor] = {}  # the tensors the package reads, kept alive
        self.compile_s: float | None = None
        self.built: bool | None = None
        self.ahead = False  # prepared before the first step (not inside a decode step)

    def serves(self, model: torch.nn.Module, token: torch.Tensor, cache: KVCache) -> bool:
        """Whether the package can run this call (else it runs eagerly)."""
        if len(cache.keys) != self.model.config.n_layers or cache.keys[0].dim() != 4:
            return False  # a pipeline stage's cache: other layers, placeholders
        k0 = cache.keys[0]
        # positions < S_max read the tables: a cache made without reserving them runs eagerly,
        # which grows them (new_cache reserves)
        short = any(len(t) < k0.shape[2] - 1 for t in rope_tables(self.model))
        return (model is self.model and not any(p.active for p in self.points) and not short
                and tuple(token.shape) == (1, 1) and token.dtype == torch.long
                and token.is_contiguous() and cache.n_slots == 1
                and MIN_COLUMNS <= k0.shape[2] <= self.max_columns
                and k0.dtype == self.cache_dtype and k0.device == token.device == self.model.device)

    def package_path(self) -> Path:
        """The package the model needs (built or not); computed once per step object."""
        if self._path is None:
            self._path = self.directory / f"decode-{package_key(self.model)}.pt2"
        return self._path

    def ready(self) -> bool:
        """Whether the package can be loaded now without building: it is loaded, or on disk."""
        return self.loader is not None or self.package_path().exists()

    def prepare(self) -> None:
        """Load the package now, building it first in this process if it is not on disk (1-3
        minutes on 2 cores), instead of at the first decode step: ``--compile`` and ``clearlm
        compile`` call it before the first token. Errors go to ``on_error`` (then every step
        runs eagerly), or are raised without one.

        Raises:
            AOTError: the package cannot be built or loaded and ``on_error`` is None.
        """
        self.ahead = self.ahead or self.loader is None
        self._prepare()

    def _prepare(self) -> None:
        if self.loader is not None or self.failed:
            return
        try:
            self._load()
        except AOTError as e:
            if self.on_error is None:
                raise
            self.failed = True
            self.on_error(e)

    def start_if_missing(self) -> None:
        """With ``start_build``: start the background build now if the package is not on disk
        (its notice comes before any text the caller prints), not at the first decode step."""
        self._building_elsewhere()

    def _building_elsewhere(self) -> bool:
        """With ``start_build``: True while the package is not on disk (the first such call
        starts the build; every call decodes eagerly until the package appears)."""
        if self.start_build is None or self.package_path().exists():
            return False
        if not self.started:
            self.started = True
            self.start_build(self.package_path())
        return True

    def build(self, path: Path) -> None:
        """Compile the package into ``path`` (a subclass exports another program)."""
        build_package(self.model, path)

    def _load(self) -> None:
        t = time.perf_counter()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            raise AOTError("the ahead-of-time step runs in one process; under tensor or pipeline "
                           "parallel each rank holds other tensors")
        kern = load_kernels()  # the package calls the kernel's ops by name: registered first
        if kern is not None:  # ... and its C shims by symbol: visible to the package's loader
            ctypes.CDLL(kern.__file__, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        self.path = self.package_path()
        self.built = not self.path.exists()
        if self.built:
            self.build(self.path)
        try:
            # a package cut short would crash the process in the loader (SIGBUS): check first
            if checksum_path(self.path).read_text().strip() != digest_of(self.path):
                raise RuntimeError("its checksum does not match")
            loader = torch._C._aoti.AOTIModelPackageLoader(str(self.path), "model", False, 1, -1)
            names = loader.get_constant_fqns()
            tensors = named_tensors(self.model)
            missing = [n for n in names if n not in tensors]
            if missing:
                raise RuntimeError(f"it does not fit this model: no tensor {missing[0]}")
            # the model's own tensors, not copies (user_managed): the weights are held once
            self.constants = {n: tensors[n] for n in names}
            loader.load_constants(self.constants, False, True, True)
        except (OSError, RuntimeError) as e:  # missing checksum, truncated or foreign file
            raise AOTError(f"cannot load {self.path} ({str(e).strip().splitlines()[0][:200]}); "
                           "delete it to rebuild") from e
        self.loader = loader
        self.compile_s = time.perf_counter() - t

    @torch.inference_mode()
    def __call__(self, model: torch.nn.Module, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        if not self.failed and self.serves(model, token, cache):
            if self.loader is None and self._building_elsewhere():
                return model(token, cache=cache, last_only=True)[:, -1, :]  # eager meanwhile
            if self.loader is None:
                self._prepare()
            if self.loader is not None:
                tables = rope_tables(self.model)  # (P, d) each, as long as the cache needs
                return self.loader.run([token, cache.lengths, *tables, *cache.keys,
                                        *cache.values])[0]
        return model(token, cache=cache, last_only=True)[:, -1, :]  # eager: the same values


def compile_decode_aot(model: Any, directory: Path | None = None,
                       on_error: Callable[[AOTError], None] | None = None,
                       start_build: Callable[[Path], None] | None = None) -> AOTDecodeStep:
    """Make generation decode with the ahead-of-time compiled step: ``model`` is a
    ``clearlm.Model`` (from clearlm.load) or its Transformer; sets the Transformer's
    ``decode_fn`` (as clearlm.runtime.compiled.compile_decode does). The package is loaded at
    the first decode step; one not built yet is built there (the call waits), or with
    ``start_build`` elsewhere while the steps run eagerly (see the module docstring)."""
    net = getattr(model, "transformer", model)
    step = AOTDecodeStep(net, directory, on_error, start_build)
    net.decode_fn = step
    return step


def failed_path(path: Path) -> Path:
    """``<package>.failed``: the error of a build that failed (see the module docstring)."""
    return path.with_name(path.name + ".failed")


def lock_path(path: Path) -> Path:
    """``<package>.lock``: the process id of the build under way."""
    return path.with_name(path.name + ".lock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def take_lock(path: Path) -> bool:
    """Take ``<package>.lock`` for this process: False when a live process holds it (a lock
    whose process is gone is taken over). Released by :func:`release_lock`."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and _alive(pid):
                return False
            lock.unlink(missing_ok=True)  # stale: its process is gone
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def release_lock(path: Path) -> None:
    """Remove ``<package>.lock`` if this process holds it."""
    lock = lock_path(path)
    try:
        if lock.read_text().strip() == str(os.getpid()):
            lock.unlink()
    except OSError:
        pass


def spawn_build(path: Path, argv: list[str]) -> Path:
    """Start ``python -m clearlm compile ARGV`` in a process of its own session (it outlives
    this one, so the package is there for the next run), its output in ``<package>.log``.

    Args:
        path: the package the build will write (for the log's name).
        argv: ``clearlm compile``'s arguments naming the same model and load options.

    Returns: the log file.
    """
    log = path.with_name(path.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        subprocess.Popen(  # noqa: S603 (our own module, arguments from our own parser)
            [sys.executable, "-m", "clearlm", "compile", *argv, "--quiet"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    return log
