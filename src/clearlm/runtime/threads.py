"""How many CPU threads torch should use, so that a second busy process does not wreck decoding.

torch starts one intra-op thread per physical core. When another process keeps those cores busy,
every matrix product waits for its slowest thread, and that thread waits for the other process:
decode fell from 30 to 0.5–1.7 tok/s on 2 shared cores, while ``OMP_NUM_THREADS=1`` gave 21.

The rule (:func:`choose_threads`, a pure function):

    usable = min(physical cores, CPUs this process may run on (sched_getaffinity))
    threads = clamp(usable − round(busy), 1, usable)

where ``busy`` is how many of those CPUs other processes kept busy (:func:`busy_cpus`): from
``/proc/stat`` read when clearlm is imported and again when the count is chosen, less this
process's own CPU time over that span (the look covers torch's import, so it costs no wait),
or a 0.1 s look when that span was shorter than 0.1 s. An explicit choice wins: ``--threads N``
(or :func:`set_threads`), then ``$OMP_NUM_THREADS`` (torch honours it itself), then the rule.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from clearlm.errors import SamplingParamsError

SAMPLE_S = 0.1  # seconds over which busy_cpus watches the CPUs (at least)
STAT_PATH = "/proc/stat"


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


def _look(stat_path: str = STAT_PATH) -> tuple[float, str, float] | None:
    """(monotonic seconds, the text of /proc/stat, this process's CPU seconds) now, or None
    without /proc."""
    try:
        stat = Path(stat_path).read_text()
    except OSError:
        return None
    own = os.times()
    return time.monotonic(), stat, own.user + own.system


def others_busy(cpus: set[int], before: tuple[float, str, float],
                after: tuple[float, str, float]) -> float:
    """How many of ``cpus`` other processes kept busy between two :func:`_look` results: busy
    jiffies less this process's own CPU time (in jiffies, ``SC_CLK_TCK`` a second), over the
    jiffies that passed; 0.0 … len(cpus)."""
    try:
        idle0, total0 = _cpu_times(before[1], cpus)
        idle1, total1 = _cpu_times(after[1], cpus)
    except ValueError:
        return 0.0
    total = total1 - total0
    if total <= 0:
        return 0.0
    own = (after[2] - before[2]) * os.sysconf("SC_CLK_TCK")
    busy = total - (idle1 - idle0) - own
    return min(float(len(cpus)), max(0.0, len(cpus) * busy / total))


def busy_cpus(cpus: set[int], seconds: float = SAMPLE_S, stat_path: str = STAT_PATH,
              since: tuple[float, str, float] | None = None) -> float:
    """How many of ``cpus`` other processes kept busy (0.0 … len(cpus)): since the look
    ``since`` when it is at least ``seconds`` old, else over ``seconds`` from now; 0.0 without
    /proc."""
    before = since if since is not None and time.monotonic() - since[0] >= seconds else None
    if before is None:
        before = _look(stat_path)
        if before is None:
            return 0.0
        time.sleep(seconds)
    after = _look(stat_path)
    return 0.0 if after is None else others_busy(cpus, before, after)


# The first look, when clearlm is imported (clearlm/__init__ imports this module before torch):
# the span up to default_threads() covers torch's import and the file's header.
_FIRST_LOOK = _look()


def default_threads() -> int:
    """The rule of the module docstring applied to this machine, now (waits up to SAMPLE_S
    seconds: none when clearlm was imported at least that long ago)."""
    global _FIRST_LOOK
    import torch

    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        cpus = set(range(os.cpu_count() or 1))
    since, _FIRST_LOOK = _FIRST_LOOK, None  # once: a later call looks afresh
    return choose_threads(torch.get_num_threads(), len(cpus), busy_cpus(cpus, since=since))


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
