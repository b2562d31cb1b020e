"""Compiled decode by default (clearlm.api.decode through the CLI): a model whose step is not
built decodes eagerly while `clearlm compile` builds it in a background process, and the next
run decodes through it; --eager and --compile choose; a build that failed is said once and not
retried; bad choices are one-line usage errors.

The suite runs with CLEARLM_DECODE=eager (tests/conftest.py); these tests take it out. One tiny
2-layer model's package is built for real in the background (~20-60 s on 2 busy cores), in a
cache folder of the module's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama


def new_cache(folder: Path) -> Path:
    """A cache folder of its own for the compiled steps, sharing the built C++ kernel (which
    lives in the cache folder too: building it again would take minutes)."""
    from clearlm.store.catalog import default_cache_dir

    kernels = default_cache_dir() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True)
    (folder / "kernels").symlink_to(kernels)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("decode")
    path = write_tiny_llama(root / "tiny.gguf", context_length=128, seed=3)
    return path, new_cache(root / "cache")


def cli(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "CLEARLM_DECODE"}
    return subprocess.run(
        [sys.executable, "-m", "clearlm", *args],
        capture_output=True, text=True, timeout=300,
        env={**base, "CLEARLM_CACHE": str(cache), "PYTHONIOENCODING": "utf-8", **env},
    )  # fmt: skip


def run_json(cache: Path, path: Path, *flags: str, **env: str) -> tuple[dict, str]:
    proc = cli(cache, "generate", "Hello", "-m", str(path), "-n", "12", "--temperature", "0",
               "--json", *flags, **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_a_model_without_its_step_decodes_eagerly_while_it_builds_then_compiled(tiny):
    path, cache = tiny
    eager, _ = run_json(cache, path, "--eager")
    assert eager["settings"]["decode"] == "eager"
    first, said = run_json(cache, path)  # auto: nothing built yet
    assert "building the compiled decode step in the background" in said, said
    assert first["settings"]["decode"] == "eager" and first["token_ids"] == eager["token_ids"]
    packages = cache / "aot"
    deadline = time.monotonic() + 280
    while not list(packages.glob("decode-*.pt2")) and time.monotonic() < deadline:
        time.sleep(2)  # the background `clearlm compile` (its log beside the package)
    built = list(packages.glob("decode-*.pt2"))
    logs = [p.read_text() for p in packages.glob("*.log")]
    assert len(built) == 1, logs
    second, said = run_json(cache, path)
    assert second["settings"]["decode"] == "aot" and "background" not in said, said
    assert second["token_ids"] == eager["token_ids"]
    # `clearlm compile` finds it built: prints its path at once
    proc = cli(cache, "compile", str(path), "-q")
    assert proc.returncode == 0 and proc.stdout.strip() == str(built[0]), proc.stderr


def test_a_build_that_failed_is_said_and_not_retried(tiny, tmp_path, monkeypatch):
    from clearlm.api.model import load
    from clearlm.runtime.aot import AOTDecodeStep, failed_path

    path, _ = tiny
    cache = new_cache(tmp_path / "cache")
    monkeypatch.setenv("CLEARLM_CACHE", str(cache))  # the package's name, as the CLI's will be
    marker = failed_path(AOTDecodeStep(load(path, decode="eager").transformer).package_path())
    # what a failed background build leaves
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("cannot compile the decode step ahead of time: a made-up reason\n")
    out, said = run_json(cache, path)
    assert out["settings"]["decode"] == "eager"
    assert "warning: the compiled decode step failed to build before (cannot compile" in said
    assert "a made-up reason" in said and "clearlm compile" in said
    assert not list((cache / "aot").glob("*.lock"))  # nothing started


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (("--compile", "--eager"), {}, "--compile and --eager contradict each other"),
        ((), {"CLEARLM_DECODE": "fast"}, "must be one of auto, compiled, eager, got 'fast'"),
    ],
)
def test_bad_decode_choices_are_usage_errors(tiny, args, env, says):
    path, cache = tiny
    proc = cli(cache, "generate", "Hello", "-m", str(path), "-n", "4", *args, **env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(lines) <= 3  # click's usage line + the error
