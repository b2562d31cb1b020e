"""bench/llamacpp_table.py on made-up numbers (no llama.cpp needed): medians, ratios, the
Markdown row of issue 10's table, llama-bench's JSON; bench/build_llamacpp.sh's early exits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from llamacpp_table import (  # noqa: E402
    HEADER,
    Run,
    markdown,
    median_run,
    parse_llama_bench,
    table_row,
)


def test_median_is_per_field():
    runs = [Run(300.0, 150.0, 147.0), Run(290.0, 140.0, 149.0), Run(310.0, 143.0, 140.0)]
    assert median_run(runs) == Run(300.0, 143.0, 147.0, None)
    ours = [Run(800.0, 30.0, 1200.0, 5.5), Run(900.0, 40.0, 1100.0, 4.0)]
    assert median_run(ours) == Run(850.0, 35.0, 1150.0, 4.75)  # even count: mean of the middle
    with pytest.raises(ValueError):
        median_run([])


def test_issue_row_formats_with_ratios():
    """The issue's first row, rebuilt from its own numbers: 848 / 298 = 2.85×, 36.9 / 143 =
    0.26×, 1,173 / 147 = 7.98× (the issue rounds it to 8.0×)."""
    llama = Run(298.0, 143.0, 147.0)
    ours = Run(848.0, 36.9, 1173.0, 5.0)
    row = table_row("SmolLM2-135M-Instruct Q4_1 (98 MB)", "float32", llama, ours)
    assert row == (
        "| SmolLM2-135M-Instruct Q4_1 (98 MB) | float32 | 298 tok/s | 848 (2.85×) | 143 tok/s "
        "| 36.9 (0.26×) | 147 MiB | 1,173 MiB (7.98×) | 5.0 s |"
    )
    assert row.count("|") == HEADER.splitlines()[0].count("|")  # as many cells as the header


def test_markdown_names_commit_date_and_method():
    text = markdown(["| a |"], "abc1234", "2026-12-01 04:00 UTC", 2, 3)
    first = text.splitlines()[0]
    assert "abc1234" in first and "2026-12-01" in first and "2 threads" in first
    assert "medians of 3" in first and text.endswith("| a |")


def test_parse_llama_bench_json():
    """Fields as llama-bench -o json writes them (one object per test)."""
    results = [
        {"n_prompt": 512, "n_gen": 0, "avg_ts": 298.4, "stddev_ts": 3.1},
        {"n_prompt": 0, "n_gen": 128, "avg_ts": 143.2, "stddev_ts": 1.0},
    ]
    assert parse_llama_bench(results) == (298.4, 143.2)
    with pytest.raises(ValueError):
        parse_llama_bench(results[:1])


BUILD = Path(__file__).resolve().parents[2] / "bench" / "build_llamacpp.sh"


TOOLS = ["llama-bench", "llama-perplexity", "llama-quantize", "llama-imatrix", "llama-server"]


def _fake_tools(tmp_path: Path, names: list[str]) -> Path:
    bin_dir = tmp_path / "llama.cpp" / "11434.0.0" / "build-noamx" / "bin"
    bin_dir.mkdir(parents=True)
    for name in names:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_build_script_is_idempotent(tmp_path):
    """With every tool in the cache the script only prints llama-bench's path (no download, no
    build)."""
    bin_dir = _fake_tools(tmp_path, TOOLS)
    env = {"CLEARLM_CACHE": str(tmp_path), "PATH": "/nonexistent"}  # no pip, cmake: not needed
    out = subprocess.run(["/bin/bash", str(BUILD)], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.strip() == str(bin_dir / "llama-bench")


def test_build_script_builds_a_missing_tool(tmp_path):
    """Idempotent per binary: llama-bench alone (an older build) is not enough; the script goes
    on to build llama-quantize and llama-server (here it stops at the missing cmake)."""
    _fake_tools(tmp_path, ["llama-bench"])
    env = {"CLEARLM_CACHE": str(tmp_path), "PATH": "/nonexistent"}
    out = subprocess.run(["/bin/bash", str(BUILD)], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "'cmake' was not found" in out.stderr


def test_build_script_names_a_missing_tool(tmp_path):
    env = {"CLEARLM_CACHE": str(tmp_path), "PATH": "/nonexistent"}
    out = subprocess.run(["/bin/bash", str(BUILD)], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "'cmake' was not found" in out.stderr
    assert not (tmp_path / "llama.cpp").exists()  # nothing downloaded


def test_compiled_row_adds_the_compile_time_to_the_load_cell():
    runs = [Run(900.0, 80.0, 500.0, 0.4, 95.0), Run(950.0, 82.0, 510.0, 0.5, 13.0),
            Run(920.0, 81.0, 505.0, 0.4, 14.0)]
    ours = median_run(runs)
    assert ours.compile_s == 14.0  # the median: a warm Inductor cache in two of three
    row = table_row("m", "compact, compiled", Run(300.0, 100.0, 150.0), ours)
    assert row.endswith("| 0.4 s + 14 s compile |")


@pytest.mark.parametrize("args, message", [
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--llama-bench", "/nonexistent/llama-bench"], "not an executable file"),
    (["--weights", "float32", "--int8", "on"], "--int8 on needs compact weights"),
])
def test_bench_refuses_what_would_fail_or_measure_nothing(args, message):
    """Each refused in one line, exit 2, before llama.cpp is built (a breaker found tracebacks,
    a llama-bench abort on -t 0, and an empty table after minutes for float32 + int8)."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "bench" / "llamacpp.py"), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and "build" not in proc.stdout


def test_bench_names_a_failing_child_in_one_line(tmp_path):
    """A llama-bench that fails: 'error: NAME failed (exit N): its last stderr line', exit 1."""
    root = Path(__file__).resolve().parents[2]
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\necho 'noise' >&2\necho 'failed to load model' >&2\nexit 3\n")
    fake.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    proc = subprocess.run([sys.executable, str(root / "bench" / "llamacpp.py"), "--llama-bench",
                           str(fake), "--models", str(model), "--repeats", "1"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CLEARLM_NO_KERNELS": "1"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: llama-bench failed (exit 3): failed to load model")
