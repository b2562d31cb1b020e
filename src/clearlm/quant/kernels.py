"""Build and load the C++ block-quantized GEMV kernel (``csrc/qgemv.cpp``).

Build choice: JIT at first use with ``torch.utils.cpp_extension.load`` (g++ and ninja, both
needed), compiled with ``-O3 -march=native -fopenmp`` for the machine it runs on, cached under
``$CLEARLM_CACHE/kernels`` (default ``~/.cache/clearlm/kernels``) so later runs load it in well
under a second: a build already there is imported directly (importlib, as torch's loader does
at its end), without importing torch.utils.cpp_extension and setuptools or running ninja (about
0.2 s of CPU time per start). ``make kernels`` (part of ``make setup``) runs
``python -m clearlm.quant.build`` to build it ahead of time on a fresh machine. Without a
compiler the module still works: :func:`load_kernels` returns None and QuantLinear
falls back to a pure-torch dequantize + matmul.

Target: ``CLEARLM_KERNEL_MARCH`` (default ``native``) is the ``-march`` the kernel is built for,
so the AVX2 and plain C++ bodies can be built and tested on an AVX-512 machine:
``haswell`` (AVX2 + FMA + F16C), ``x86-64`` (plain C++, SSE2 only). It is part of
:func:`build_dir`'s key, so builds for different targets never mix (``make kernel-isa-check``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

from clearlm.store.catalog import default_cache_dir

SOURCE = Path(__file__).with_name("csrc") / "qgemv.cpp"
SOURCES = (
    SOURCE,  # exact kernel
    SOURCE.with_name("qgemv_i8.cpp"),  # int8-activation variant
    SOURCE.with_name("qgemv_half.cpp"),  # float16 / bfloat16 weights
    SOURCE.with_name("qgemv_ops.cpp"),  # checks and bindings
)
NAME = "clearlm_qgemv"
MARCH_ENV = "CLEARLM_KERNEL_MARCH"
LDFLAGS = ["-fopenmp"]
_loaded: list[ModuleType | None] = []


def cflags() -> list[str]:
    """The compiler flags: ``-O3 -march=<CLEARLM_KERNEL_MARCH or native> -fopenmp``.

    Raises ValueError when the variable is not a plain target name (letters, digits, ``-_.``),
    which load_kernels reports as 'kernel unavailable'."""
    march = os.environ.get(MARCH_ENV) or "native"
    if not (march[0].isalnum() and all(c.isalnum() or c in "_.-" for c in march)):
        raise ValueError(f"{MARCH_ENV}={march!r} is not a -march target name (e.g. native, "
                         "haswell, x86-64)")
    return ["-O3", f"-march={march}", "-fopenmp"]


def build_dir() -> Path:
    """Where the compiled extension lives: keyed by the sources' hash, the torch and Python
    versions and the flags, ``-march`` included (a build found there is imported as it is, so
    the key must name everything it depends on)."""
    import torch

    root = default_cache_dir()
    text = b"".join(p.read_bytes() for p in SOURCES) + torch.__version__.encode()
    text += " ".join([*cflags(), *LDFLAGS, *importlib.machinery.EXTENSION_SUFFIXES]).encode()
    key = hashlib.sha256(text).hexdigest()[:12]
    return root / "kernels" / f"qgemv-{key}"


def load_kernels(verbose: bool = False) -> ModuleType | None:
    """The compiled module (``qmm``, ``qmm_i8``, ``qmm_i8_available``, ``hmm``, ``dequant``), or
    None if it cannot be built.

    Set ``CLEARLM_NO_KERNELS=1`` to force the pure-torch fallback (used by the tests)."""
    if _loaded:
        return _loaded[0]
    module = None
    if os.environ.get("CLEARLM_NO_KERNELS") != "1":
        try:
            out = build_dir()
            module = _import_built(out)
            if module is None:
                from torch.utils.cpp_extension import load

                print(f"clearlm: building the quantized kernel once into {out} (about a "
                      "minute on 2 cores; `make kernels` does it ahead)", file=sys.stderr,
                      flush=True)
                out.mkdir(parents=True, exist_ok=True)
                module = load(
                    name=NAME,
                    sources=[str(p) for p in SOURCES],
                    build_directory=str(out),
                    extra_cflags=cflags(),  # copies: torch appends to the lists it gets
                    extra_ldflags=list(LDFLAGS),
                    verbose=verbose,
                )
        except Exception as exc:  # noqa: BLE001 - any build failure means: use the fallback
            warnings.warn(f"clearlm: quantized kernel unavailable ({exc}); compact weights use "
                          "the pure-torch fallback, about 10x slower (`--weights float32` is "
                          "faster there, at about 6x the memory)", stacklevel=2)
            module = None
    _loaded.append(module)
    return module



def _import_built(out: Path) -> ModuleType | None:
    """The extension already built in ``out``, imported; None if there is none yet or a build
    is running there (torch's loader holds ``out/lock`` while it builds: it waits for that)."""
    so = out / f"{NAME}.so"
    if not so.is_file() or (out / "lock").exists():
        return None
    spec = importlib.util.spec_from_file_location(NAME, so)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
