"""How many CPU threads torch should use, so that a second busy process does not wreck decoding.

torch starts one intra-op thread per physical core. When another process keeps those cores busy,
every matrix product waits for its slowest thread, and that thread waits for the other process:
decode fell from 30 to 0.5–1.7 tok/s on 2 shared cores, while ``OMP_NUM_THREADS=1`` gave 21.

The rule (:func:`choose_threads`, a pure function):

    usable = min(physical cores, CPUs this process may run on (sched_getaffinity))
    threads = clamp(usable − round(busy), 1, usable)

where ``busy`` is how many of those CPUs other processes kept busy during a 0.1 s look at
``/proc/stat`` just before loading (:func:`busy_cpus`). An explicit choice wins: ``--threads N``
(or :func:`set_threads`), then ``$OMP_NUM_THREADS`` (torch honours it itself), then the rule.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from clearlm.errors import SamplingParamsError

SAMPLE_S = 0.1  # seconds over which busy_cpus watches the CPUs


def choose_threads(physical: int, allowed: int, busy: float) -> int:
    """The thread count for ``physical`` cores, ``allowed`` usable CPUs, ``busy`` CPUs in use.

    Args:
        physical: physical cores (torch's own default thread count).
        allowed: CPUs the process may run on (``len(os.sched_getaffinity(0))``).
        busy: CPUs (a float, e.g. 1.7) that other processes kept busy.

    Returns:
        An int in [1, min(physical, allowed)]: the usable CPUs less the busy ones, rounded.
    """
    usable = max(1, min(physical, allowed))
    return max(1, min(usable, usable - round(busy)))


def _cpu_times(stat: str, cpus: set[int]) -> tuple[int, int]:
    """(idle, total) jiffies summed over the ``cpuN`` lines of /proc/stat whose N is in cpus."""
    idle = total = 0
    for line in stat.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        idle += values[3] + values[4]
        total += sum(values)
    return idle, total


def busy_cpus(cpus: set[int], seconds: float = SAMPLE_S, stat_path: str = "/proc/stat") -> float:
    """How many of ``cpus`` were busy (0.0 … len(cpus)) over ``seconds``; 0.0 without /proc."""
    path = Path(stat_path)
    try:
        idle0, total0 = _cpu_times(path.read_text(), cpus)
        time.sleep(seconds)
        idle1, total1 = _cpu_times(path.read_text(), cpus)
    except (OSError, ValueError):
        return 0.0
    if total1 <= total0:
        return 0.0
    return len(cpus) * (1.0 - (idle1 - idle0) / (total1 - total0))


def default_threads() -> int:
    """The rule of the module docstring applied to this machine, now (takes SAMPLE_S seconds)."""
    import torch

    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        cpus = set(range(os.cpu_count() or 1))
    return choose_threads(torch.get_num_threads(), len(cpus), busy_cpus(cpus))


# More threads than this only slows torch down; far more crashes its OpenMP runtime
# (`--threads 100000` ended in a segfault in libgomp).
MAX_THREADS = 512


def set_threads(threads: int | None = None) -> int:
    """Set torch's intra-op thread count and return it.

    Args:
        threads: a count in [1, MAX_THREADS]; None means ``$OMP_NUM_THREADS`` when it is set
            (left as torch read it), else :func:`default_threads`.

    Raises:
        SamplingParamsError: threads outside [1, MAX_THREADS].
    """
    import torch

    if threads is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return torch.get_num_threads()
        threads = default_threads()
    if (
        isinstance(threads, bool)
        or not isinstance(threads, int)
        or not 1 <= threads <= MAX_THREADS
    ):
        raise SamplingParamsError(
            f"threads must be an integer from 1 to {MAX_THREADS}, got {threads!r}"
        )
    torch.set_num_threads(threads)
    return threads
