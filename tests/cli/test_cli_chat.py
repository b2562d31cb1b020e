"""generate/chat input and output: '-' and -f, --json with logprobs, a closed pipe, and the
multi-turn chat driven through a pipe and through a pseudo-terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest
import torch
from cli_in_process import run_clearlm
from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_llama

import clearlm


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("chat") / "tiny.gguf", context_length=256)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return clearlm.load(tiny_path)


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (a subprocess spends
    ~2.5 s importing torch); standard input through a real pipe uses cli_process."""
    return run_clearlm(*args, stdin=stdin)


def cli_process(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "clearlm", *args], input=stdin, capture_output=True, env=env,
        timeout=300,
    )  # fmt: skip


def test_generate_reads_stdin_and_file_bytes_as_utf8_without_newline_translation(
    tiny, tiny_path, tmp_path
):
    raw = b"hello\r\nw\xffrld -\n\n"  # CRLF kept, an invalid byte becomes U+FFFD
    expected = tiny.encode("hello\r\nw\ufffdrld -\n")  # the one last line ending dropped
    args = ("-m", str(tiny_path), "-n", "3", "--temperature", "0", "--json")
    replaced = "is not UTF-8 text (invalid byte 0xff at offset 8); its invalid bytes became U+FFFD"
    proc = cli_process("generate", "-", *args, stdin=raw)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_token_ids"] == expected
    assert f"warning: standard input {replaced}" in proc.stderr.decode()  # said, not silent
    f = tmp_path / "prompt.txt"
    f.write_bytes(raw)
    proc = cli("generate", "-f", str(f), *args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_token_ids"] == expected
    assert f"prompt.txt {replaced}" in proc.stderr.decode()
    proc = cli("generate", "-", "-f", str(f), *args)  # both: a usage error
    assert proc.returncode == 2 and b"not both" in proc.stderr
    proc = cli("generate", "-f", str(tmp_path / "missing.txt"), *args)
    assert proc.returncode == 1
    assert proc.stderr.decode().strip().startswith("error: prompt file not found:")


def test_json_output_and_logprobs_match_a_direct_computation(tiny, tiny_path):
    proc = cli(
        "generate", "hello world", "-m", str(tiny_path), "-n", "6", "--temperature", "0",
        "--logprobs", "3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1  # one object, nothing streamed before it
    out = json.loads(lines[0])
    ref = tiny.generate("hello world", max_new_tokens=6, temperature=0)
    assert out["text"] == ref.text and out["token_ids"] == ref.tokens
    assert out["finish_reason"] == ref.finish_reason
    assert out["prompt_token_ids"] == tiny.encode("hello world")
    assert out["model"] == str(tiny_path)
    assert out["settings"] == {"weights": "float32", "dtype": "float32", "activations": "float32",
                               "matmul_precision": "highest", "decode": "eager"}  # F32 tensors
    assert set(out["timings"]) == {
        "prefill_s", "decode_s", "prefill_tokens_per_s", "decode_tokens_per_s"
    }  # fmt: skip
    assert len(out["logprobs"]) == len(ref.tokens)
    prefix = tiny.encode("hello world")
    for step, tok in zip(out["logprobs"], ref.tokens, strict=True):
        logp = torch.log(tiny.next_token_distribution(prefix))  # (V,) the raw model's
        assert step["id"] == tok
        assert step["logprob"] == pytest.approx(float(logp[tok]), abs=1e-4)
        top = logp.topk(3)
        assert [t["id"] for t in step["top"]] == top.indices.tolist()
        assert [t["logprob"] for t in step["top"]] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert step["top"][0]["id"] == tok  # greedy picks the argmax
        prefix = prefix + [tok]


def test_json_settings_are_the_modes_that_took_effect(tmp_path):
    path = write_tiny_llama(tmp_path / "q8.gguf", matrix_type=Q.Q8_0)  # packed: compact
    proc = cli("generate", "hi", "-m", str(path), "-n", "2", "--json", "--matmul-precision",
               "medium", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)["settings"]
    assert settings == {"weights": "compact", "dtype": "float32", "activations": "float32",
                        "matmul_precision": "medium", "decode": "eager"}


def test_chat_message_from_stdin_with_json(tiny, tiny_path):
    proc = cli("chat", "-", "-m", str(tiny_path), "-n", "5", "--json", "--temperature", "0",
               stdin=b"hi there")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ref = tiny.chat("hi there", max_new_tokens=5, temperature=0)
    assert out["prompt_token_ids"] == tiny.chat_prompt("hi there")
    assert out["token_ids"] == ref.tokens and out["text"] == ref.text
    assert "logprobs" not in out
    proc = cli("chat", "-m", str(tiny_path), "--json", stdin=b"hi\n")  # no conversation in JSON
    assert proc.returncode == 2 and b"need a MESSAGE" in proc.stderr


def test_closed_pipe_ends_quietly_with_status_0(tiny_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "clearlm", "generate", "hello", "-m", str(tiny_path), "-n", "80",
         "--temperature", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout.read(5)  # `| head -c 5`: read a little, then close the pipe
    proc.stdout.close()
    rc = proc.wait(timeout=300)
    stderr = proc.stderr.read().decode()
    assert rc == 0, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr


def test_chat_without_message_keeps_history_through_a_pipe(tiny, tiny_path):
    lines = "hi\n/system You are terse.\nhello\n\n/reset\nyo\n/nope\n"
    proc = cli_process("chat", "-m", str(tiny_path), "-n", "6", "--temperature", "0",
               stdin=lines.encode())
    assert proc.returncode == 0, proc.stderr
    system = {"role": "system", "content": "You are terse."}
    a1 = tiny.chat([{"role": "user", "content": "hi"}], max_new_tokens=6, temperature=0).text
    a2 = tiny.chat(
        [system, {"role": "user", "content": "hi"}, {"role": "assistant", "content": a1},
         {"role": "user", "content": "hello"}],
        max_new_tokens=6, temperature=0,
    ).text  # fmt: skip
    a3 = tiny.chat([system, {"role": "user", "content": "yo"}], max_new_tokens=6,
                   temperature=0).text
    assert proc.stdout.decode() == f"{a1}\n{a2}\n{a3}\n"
    err = proc.stderr.decode()
    assert "conversation cleared" in err and "unknown command /nope" in err
    assert err.count("finish:") == 3


def _read_until(fd: int, needle: bytes, buf: bytearray, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while needle not in buf:
        assert time.monotonic() < end, f"no {needle!r} in {bytes(buf)!r}"
        if select.select([fd], [], [], 0.5)[0]:
            try:
                buf += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
    assert needle in buf, bytes(buf)


def test_chat_in_a_pseudo_terminal_ctrl_c_stops_an_answer_and_ctrl_d_leaves(tiny_path):
    argv = [sys.executable, "-m", "clearlm", "chat", "-m", str(tiny_path), "-n", "200"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty, so ^C is SIGINT
        # a test run started in the background inherits SIGINT ignored, and Python then sets
        # no KeyboardInterrupt handler: give the child the default a terminal user has
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(sys.executable, argv)
    buf = bytearray()
    _read_until(fd, b">>> ", buf)
    os.write(fd, b"hi\r")
    _read_until(fd, b"hi\r\n", buf)  # the echo, then the answer streams
    start = len(buf)
    while len(buf) == start:  # wait for the first bytes of the answer
        if select.select([fd], [], [], 0.5)[0]:
            buf += os.read(fd, 4096)
    os.write(fd, b"\x03")  # Ctrl-C during the answer: stops it, back to the prompt
    _read_until(fd, b"answer stopped", buf)
    _read_until(fd, b">>> ", buf[buf.index(b"answer stopped") :])
    os.write(fd, b"\x04")  # Ctrl-D at the prompt leaves
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def test_piped_chat_exits_with_a_failed_turns_code_and_warns_of_bad_utf8(tiny, tiny_path):
    """A turn past the context fails (its error line), the next is answered; the status is the
    failure's code (6), not 0. A line that is not UTF-8 gets generate -'s warning line and its
    bad byte becomes U+FFFD."""
    lines = b"x " * 300 + b"\nh\xffi\n"
    proc = cli("chat", "-m", str(tiny_path), "-n", "4", "--temperature", "0", stdin=lines)
    assert proc.returncode == 6, proc.stderr
    err = proc.stderr.decode()
    assert err.count("error:") == 1 and "context" in err
    assert ("warning: standard input is not UTF-8 text (invalid byte 0xff at offset 1); its "
            "invalid bytes became U+FFFD") in err  # fmt: skip
    answer = tiny.chat([{"role": "user", "content": "h\ufffdi"}], max_new_tokens=4,
                       temperature=0).text  # fmt: skip
    assert proc.stdout.decode() == f"{answer}\n"
    ok = cli("chat", "-m", str(tiny_path), "-n", "2", "-q", stdin=b"hi\n")
    assert ok.returncode == 0 and ok.stderr == b""
