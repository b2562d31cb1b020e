"""Start N local ranks of a command as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR=127.0.0.1, a free MASTER_PORT), with a time limit; used by
tests/runtime/test_parallel.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([SRC, str(Path(__file__).parent)]),
        "OMP_NUM_THREADS": "1",
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def run_ranks(
    commands: list[list[str]], timeout_s: float, env: dict[int, dict[str, str]] | None = None
) -> list[subprocess.CompletedProcess]:
    """Run commands[r] as rank r of len(commands), all at once (``env[r]`` added to rank r's
    environment); kill them all past timeout_s. Returns each rank's completed process."""
    port = free_port()
    procs = [
        subprocess.Popen(
            cmd,
            env={**rank_env(r, len(commands), port), **(env or {}).get(r, {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r, cmd in enumerate(commands)
    ]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout_s)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def clearlm_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "clearlm", *args]
