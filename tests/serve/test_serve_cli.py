"""``clearlm serve`` as a process: it starts, answers, warns when exposed without a key, and on
SIGTERM or Ctrl-C finishes what is in flight and exits with status 0. Also the README's
client snippet, run as pasted (only the port is changed) against a server."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serve_helpers import free_port, serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.cli.serve import is_loopback
from clearlm.serve import create_app

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("c") / "t.gguf", context_length=256)


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    env.pop("CLEARLM_API_KEY", None)
    return subprocess.Popen(
        [sys.executable, "-m", "clearlm", "serve", *args, "--threads", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_up(proc: subprocess.Popen, url: str, headers: dict | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            httpx.get(url, headers=headers, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("server did not start")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_finishes_the_request_in_flight_and_exits_0(gguf, sig):
    """SIGTERM on a server exposed without a key (it warns), Ctrl-C on one with a key."""
    port = free_port()
    exposed = sig == signal.SIGTERM
    key = [] if exposed else ["--api-key", "k"]
    proc = start([str(gguf), "--port", str(port), "--host", "0.0.0.0" if exposed else "127.0.0.1",
                  *key])  # fmt: skip
    try:
        base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k"}
        wait_up(proc, f"{base}/health", auth)
        lines: list[str] = []
        body = {"model": "t.gguf", "prompt": "x", "max_tokens": 200, "stream": True, "seed": 1}

        def stream() -> None:
            with httpx.stream("POST", f"{base}/v1/completions", json=body, headers=auth,
                              timeout=60) as r:  # fmt: skip
                lines.extend(ln for ln in r.iter_lines() if ln)

        reader = threading.Thread(target=stream)
        reader.start()
        while not lines and reader.is_alive():  # the stream has begun
            time.sleep(0.01)
        proc.send_signal(sig)
        assert proc.wait(30) == 0
        reader.join(10)
        assert lines[-1] == "data: [DONE]"  # the request in flight was finished
        err = proc.stderr.read()
        assert "stopped" in err and "Traceback" not in err
        assert re.search(r"completion cmpl-\w+ prompt_tokens=1 completion_tokens=\d+ ttft=", err)
        warned = "warning: serving on 0.0.0.0 without an API key" in err
        assert warned == exposed
        with pytest.raises(httpx.TransportError):  # no longer accepting
            httpx.get(f"{base}/health", headers=auth, timeout=2)
    finally:
        proc.kill()


def test_busy_port_is_one_line_error(gguf):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = start([str(gguf), "--port", port])
        assert proc.wait(30) != 0
    err = proc.stderr.read()
    assert f"error: cannot serve on 127.0.0.1:{port}" in err and "Traceback" not in err



def test_max_seq_len_past_the_context_is_capped_and_said(gguf):
    port = free_port()
    proc = start([str(gguf), "--port", str(port), "--max-seq-len", "100000", "--max-batch", "1"])
    try:
        wait_up(proc, f"http://127.0.0.1:{port}/health")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        err = proc.stderr.read()
        assert ("warning: --max-seq-len 100000 is past the model's context length; each "
                "sequence holds 256 tokens") in err
    finally:
        proc.kill()


def test_an_empty_api_key_is_refused(gguf):
    """`--api-key "$KEY"` with KEY unset must not serve without a key by accident."""
    proc = start([str(gguf), "--port", str(free_port()), "--api-key", ""])
    assert proc.wait(30) == 2
    err = proc.stderr.read().strip()
    assert "--api-key" in err and "the key is empty" in err and len(err.splitlines()) == 1

def test_inspect_options_without_inspect_are_one_warning(tmp_path, monkeypatch, capsys):
    """Said at startup, before the load (the missing model then stops it, exit 3)."""
    from clearlm.cli import main

    missing = str(tmp_path / "none.gguf")
    argv = ["clearlm", "serve", missing, "--port", "0", "--inspect-keep", "5"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 3 and lines[0] == (
        "warning: --inspect-keep has no effect without --inspect; add --inspect to keep "
        "completions for /v1/inspect/ID"
    )
    assert len(lines) == 2 and lines[1].startswith("error: model")


def test_is_loopback():
    assert all(map(is_loopback, ["127.0.0.1", "127.5.0.1", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.2", "::", "example.com"]))


def readme_snippet() -> str:
    """The README's Python client example (the block after 'openai client, as pasted')."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tail = text.split("<!-- serve-client-snippet -->", 1)[1]
    return tail.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_client_snippet_runs_as_pasted(gguf, capsys):
    code = readme_snippet()
    assert "http://127.0.0.1:8000/v1" in code
    model = clearlm.load(gguf)
    with serving(create_app(model, model_id="smollm2-135m-instruct")) as url:
        exec(compile(code.replace("http://127.0.0.1:8000/v1", url), "README.md", "exec"), {})
    out = capsys.readouterr().out
    want = model.chat("What is the capital of France?", max_new_tokens=32, temperature=0).text
    assert out.startswith(want)
