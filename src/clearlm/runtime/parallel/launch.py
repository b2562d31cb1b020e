"""Joining the other processes: torch.distributed's process group, started by ``torchrun``.

``torchrun`` (or any launcher) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
:func:`init` joins with ``gloo`` on CPUs and ``nccl`` on CUDA. Every wait is bounded by the
process-group timeout (``--dist-timeout``, default 30 s): a rendezvous that cannot be reached,
a rank that dies or one that stops answering ends each rank with a one-line DistributedError
(the CLI's ``error: ...``, exit code 11), never a hang. A dead peer's closed socket is seen at
once; a silent one after the timeout.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from clearlm.errors import DistributedError

DEFAULT_TIMEOUT_S = 30.0
T = TypeVar("T")


def dist_timeout() -> float:
    """The process-group timeout in seconds: ``$CLEARLM_DIST_TIMEOUT`` (set by the CLI's
    ``--dist-timeout``) or 30.

    Raises:
        DistributedError: the variable is not a number."""
    value = os.environ.get("CLEARLM_DIST_TIMEOUT", str(DEFAULT_TIMEOUT_S))
    try:
        return float(value)
    except ValueError:
        raise DistributedError(f"CLEARLM_DIST_TIMEOUT must be seconds, got {value!r}") from None


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return (
        dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    )


def is_output_rank() -> bool:
    """Only rank 0 prints text and statistics."""
    return rank() == 0


def _first_line(e: BaseException) -> str:
    """The first line of a native error, without gloo's ``[/path/pair.cc:553] `` prefix."""
    text = str(e).strip().splitlines()
    line = re.sub(r"^\[[^\]]*:\d+\] ", "", text[0]) if text else type(e).__name__
    return line[:160]


def init(device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
    """Join the process group (once); return (rank, world size).

    Raises:
        DistributedError: not started by torchrun (no RANK / WORLD_SIZE), or the rendezvous at
            MASTER_ADDR:MASTER_PORT was not reached within ``timeout_s`` seconds.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise DistributedError(
            "--tensor-parallel / --pipeline-parallel need one process per rank: start with "
            "torchrun --nproc-per-node N -m clearlm ..."
        )
    if timeout_s <= 0:
        raise DistributedError(f"the process-group timeout must be > 0 seconds, got {timeout_s}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    try:
        with _native_stderr_hidden():  # c10d logs each failed connect try with a C++ trace
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    except Exception as e:  # DistStoreError, RuntimeError, TimeoutError, ValueError ...
        raise DistributedError(
            f"rank {os.environ['RANK']}: could not join the other ranks at {where} within "
            f"{timeout_s:g} s ({_first_line(e)})"
        ) from None
    return dist.get_rank(), dist.get_world_size()


@contextmanager
def _native_stderr_hidden() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null for the block (native code writes there directly;
    the error that ends the block still reaches the user as one line)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


@contextmanager
def collective(what: str) -> Iterator[None]:
    """Turn a failed send / recv / all-reduce (a peer died, or the timeout passed) into one
    line: ``DistributedError('rank 1: lost the other ranks during all_reduce (...)')``."""
    try:
        yield
    except DistributedError:
        raise
    except Exception as e:  # gloo/nccl raise RuntimeError / DistBackendError subclasses
        raise DistributedError(
            f"rank {rank()}: lost the other ranks during {what} ({_first_line(e)})"
        ) from None


def run(what: str, fn: Callable[[], T]) -> T:
    """``fn()`` inside :func:`collective`."""
    with collective(what):
        return fn()


def shared_seed(seed: int | None) -> int | None:
    """The seed every rank samples with: ``seed`` itself, or (None, several ranks) one drawn on
    rank 0 and broadcast, so that all ranks draw the same token from the same logits."""
    if seed is not None or not dist.is_initialized() or dist.get_world_size() == 1:
        return seed
    value = torch.tensor([secrets.randbits(62) if dist.get_rank() == 0 else 0], dtype=torch.long)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    run("the seed broadcast", lambda: dist.broadcast(value, src=0))
    return int(value.item())


def shutdown() -> None:
    """Leave the process group (at the end of a command; harmless when not joined).

    A barrier first: every rank is done with its collectives before any closes its connections.
    Without it, rank 0 of a 2-process torchrun generate aborted in about 1 of 13 runs here
    ("terminate called without an active exception", exit -6), most likely gloo reacting to a
    peer that had already closed its side."""
    if dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a broken group: the process is ending anyway
            pass
