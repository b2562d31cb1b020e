"""The llama.cpp comparison table: medians of repeated runs, ratios, Markdown (bench/llamacpp.py).

Kept apart from the runner so that tests/test_bench_table.py checks it on made-up numbers
without llama.cpp. Units: tok/s for pp512 / tg128, MiB for peak RSS, seconds for load.
A ratio is clearlm's figure over llama.cpp's (so > 1 means clearlm is faster, or heavier for
RSS), written after clearlm's figure as "848 (2.85×)", as in issue 10's table.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

HEADER = (
    "| model (GGUF) | clearlm weights | pp512 llama.cpp | pp512 clearlm | tg128 llama.cpp "
    "| tg128 clearlm | peak RSS llama.cpp | peak RSS clearlm | clearlm load |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


@dataclass(frozen=True)
class Run:
    """One measurement of one engine on one file: tok/s, MiB, seconds (load None for
    llama-bench, which does not report it; compile None without a compiled decode step)."""

    pp512: float
    tg128: float
    rss_mib: float
    load_s: float | None = None
    compile_s: float | None = None  # a compiled decode step's first call


def median_run(runs: list[Run]) -> Run:
    """Field-by-field median (each field on its own, as the issue's table reports them).

    Raises ValueError for no runs."""
    if not runs:
        raise ValueError("no runs to summarise")
    loads = [r.load_s for r in runs if r.load_s is not None]
    compiles = [r.compile_s for r in runs if r.compile_s is not None]
    return Run(
        statistics.median(r.pp512 for r in runs),
        statistics.median(r.tg128 for r in runs),
        statistics.median(r.rss_mib for r in runs),
        statistics.median(loads) if loads else None,
        statistics.median(compiles) if compiles else None,
    )


def rate(x: float) -> str:
    """tok/s: thousands separated, no decimals from 100 up, one decimal below."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def with_ratio(ours: str, x: float, ref: float) -> str:
    """'848 (2.85×)': our figure followed by ours / reference."""
    return f"{ours} ({x / ref:.2f}×)" if ref > 0 else ours


def table_row(label: str, weights: str, llama: Run, ours: Run) -> str:
    """One Markdown row; llama and ours are medians (median_run)."""
    load = f"{ours.load_s:.1f} s" if ours.load_s is not None else "-"
    if ours.compile_s is not None:
        load += f" + {ours.compile_s:.0f} s compile"
    cells = [
        label,
        weights,
        f"{rate(llama.pp512)} tok/s",
        with_ratio(rate(ours.pp512), ours.pp512, llama.pp512),
        f"{rate(llama.tg128)} tok/s",
        with_ratio(rate(ours.tg128), ours.tg128, llama.tg128),
        f"{llama.rss_mib:,.0f} MiB",
        with_ratio(f"{ours.rss_mib:,.0f} MiB", ours.rss_mib, llama.rss_mib),
        load,
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(rows: list[str], commit: str, date: str, threads: int, repeats: int) -> str:
    """The whole table with the line that says what, where and when it was measured."""
    head = (
        f"clearlm {commit}, {date}; llama.cpp's llama-bench and clearlm alternately, "
        f"{threads} threads, medians of {repeats}; ratios are clearlm / llama.cpp.\n"
    )
    return head + "\n" + HEADER + "\n" + "\n".join(rows)


def parse_llama_bench(results: list[dict]) -> tuple[float, float]:
    """(pp512, tg128) tok/s from ``llama-bench -o json`` (a list with one object per test:
    n_prompt > 0 for the prompt test, n_gen > 0 for the generation test, avg_ts their mean
    tokens/s over llama-bench's own repetitions).

    Raises ValueError when either test is missing."""
    pp = [r["avg_ts"] for r in results if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0]
    tg = [r["avg_ts"] for r in results if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0]
    if not pp or not tg:
        raise ValueError("llama-bench's JSON has no prompt or no generation test")
    return float(pp[0]), float(tg[0])
