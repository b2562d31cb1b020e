"""What a fresh user met on a clean clone: --quiet in the chat loop, folders given as files, the
Python API's thread rule and keyword mistakes, -h, -p, --dtype, Ctrl-C while loading, closed
pipes for every command, and the small warnings and hints."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import typer
from cli_in_process import run_clearlm
from tiny_gguf import write_tiny_llama
from typer.testing import CliRunner

import clearlm
from clearlm.cli import app
from clearlm.errors import ChatTemplateError, ClearLMError, SamplingParamsError


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("polish") / "tiny.gguf", context_length=256)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return clearlm.load(tiny_path, threads=1)


def cli(*args: str, stdin: bytes | None = None, **env: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (a subprocess spends
    ~2.5 s importing torch); what a process does (pipes, signals, a crash) uses cli_process."""
    return run_clearlm(*args, stdin=stdin, **env)


def cli_process(*args: str, stdin: bytes | None = None, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONIOENCODING": "utf-8", **env}
    return subprocess.run(
        [sys.executable, "-m", "clearlm", *args], input=stdin, capture_output=True, env=full_env,
        timeout=300,
    )  # fmt: skip


def test_quiet_silences_the_stats_of_the_chat_loop(tiny, tiny_path):
    lines = b"hi\nhello\n"
    greedy = ("--temperature", "0")  # the same answers twice
    loud = cli("chat", "-m", str(tiny_path), "-n", "5", *greedy, stdin=lines)
    quiet = cli("chat", "-m", str(tiny_path), "-n", "5", "-q", *greedy, stdin=lines)
    assert loud.returncode == quiet.returncode == 0, (loud.stderr, quiet.stderr)
    assert loud.stderr.decode().count("finish:") == 2
    assert quiet.stderr == b""
    assert quiet.stdout == loud.stdout  # the same answers, only the stats line is gone
    first = tiny.chat("hi", max_new_tokens=5, temperature=0).text
    assert quiet.stdout.decode().startswith(first + "\n")


def test_a_folder_given_as_a_file_says_it_is_a_directory(tmp_path, tiny_path):
    for reader in (
        lambda: clearlm.text.read_text_file(tmp_path),
        lambda: clearlm.text.read_text_file(tmp_path, what="prompt file"),
    ):
        with pytest.raises(ClearLMError, match="is a directory, not a file"):
            reader()
    gen = cli("generate", "-f", str(tmp_path), "-m", str(tiny_path))
    ppl = cli("perplexity", str(tmp_path), "-m", str(tiny_path))
    for proc in (gen, ppl):
        line = proc.stderr.decode().strip()
        assert proc.returncode == 1 and line.startswith("error:"), line
        assert f"{tmp_path} is a directory, not a file" in line and "not found" not in line
    missing = cli("generate", "-f", str(tmp_path / "nope.txt"), "-m", str(tiny_path))
    assert missing.returncode == 1 and b"prompt file not found" in missing.stderr


def test_threads_module_is_reachable_after_import_clearlm():
    code = (
        "import clearlm, torch; "
        "print(clearlm.runtime.threads.set_threads(1), torch.get_num_threads())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1"]


def test_load_applies_the_thread_rule_or_the_given_count(tiny_path, monkeypatch):
    before = torch.get_num_threads()
    try:
        clearlm.load(tiny_path, threads=2)
        assert torch.get_num_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(clearlm.runtime.threads, "default_threads", lambda: 1)  # the CLI's rule
        clearlm.load(tiny_path)
        assert torch.get_num_threads() == 1
        with pytest.raises(SamplingParamsError, match="threads must be an integer"):
            clearlm.load(tiny_path, threads=0)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("method", "kwargs", "hint"),
    [
        ("generate", {"max_length": 5}, "use max_new_tokens"),
        ("generate", {"do_sample": True}, "temperature=0 is greedy"),
        ("stream", {"temprature": 0.5}, "the settings are"),
        ("chat", {"top_n": 3}, "the settings are"),
    ],
)
def test_unknown_sampling_keywords_are_a_typed_error(tiny, method, kwargs, hint):
    with pytest.raises(SamplingParamsError) as e:
        getattr(tiny, method)("Hi", **kwargs)
    message = str(e.value)
    assert f"{method}() got an unknown setting {next(iter(kwargs))!r}" in message
    assert hint in message and "temperature, top_k, top_p, min_p, repetition_penalty" in message


def test_chat_takes_a_system_message(tiny):
    system = {"role": "system", "content": "Be brief."}
    got = tiny.chat("Hi", system="Be brief.", max_new_tokens=6, seed=5)
    want = tiny.chat([system, {"role": "user", "content": "Hi"}], max_new_tokens=6, seed=5)
    assert got.tokens == want.tokens and got.prompt_tokens == want.prompt_tokens
    assert got.prompt_tokens > tiny.chat("Hi", max_new_tokens=0).prompt_tokens
    with pytest.raises(ChatTemplateError, match="start with a system message"):
        tiny.chat([system, {"role": "user", "content": "Hi"}], system="again")


def test_dtype_is_a_usage_error_naming_the_allowed_values(tiny_path):
    proc = cli("generate", "hi", "-m", str(tiny_path), "--dtype", "bogus")
    line = proc.stderr.decode().strip()
    assert proc.returncode == 2
    assert line.startswith("error:") and "'bogus' is not one of float32, bfloat16, float16" in line


def test_ctrl_c_while_loading_says_so_even_with_quiet(tiny_path, monkeypatch, capsys):
    from clearlm.cli import loader

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("clearlm.api.model.load", interrupted)
    for quiet in (False, True):
        with pytest.raises(typer.Exit) as e:
            loader.load_model(str(tiny_path), threads=1, quiet=quiet)
        assert e.value.exit_code == 130
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == "interrupted while loading tiny.gguf"


def test_h_is_help_everywhere_and_help_reflows():
    # the installed entry point once (a process each: ~4 s), then every command in this process
    short, long = cli("-h", COLUMNS="300"), cli("--help", COLUMNS="300")
    assert short.returncode == long.returncode == 0, short.stderr
    assert short.stdout == long.stdout and b"Usage:" in short.stdout
    # the docstring's lines join into one paragraph on a wide terminal
    explain = short.stdout.decode()
    assert "where the last token attends, residual-stream norms and FFN statistics" in explain
    runner = CliRunner()
    for args in ((), ("generate",), ("chat",), ("info",), ("explain",), ("perplexity",)):
        short, long = (
            runner.invoke(app, [*args, flag], env={"COLUMNS": "300"}, prog_name="clearlm")
            for flag in ("-h", "--help")
        )
        assert short.exit_code == long.exit_code == 0, short.output
        assert short.output == long.output and "Usage:" in short.output
        assert "<bool>" not in short.output  # flags take no value: no type shown


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["generate", "-h"], ["generate", "--bogus"], ["generate", "-p", "hi", "extra"],
     ["chat", "--json"], ["generate", "-p", "hi", "--temperature", "-1"],
     ["generate", "-p", "hi", "--stop", ""], ["chat", "--top-p", "2"],
     ["generate", "-m", "no-such-model", "-p", "hi"], ["chat", "-m", "/no/such.gguf"],
     ["generate", "-m", "/no/such.gguf", "-p", "x"], ["chat", "--stop", ""]],
)  # fmt: skip
def test_help_and_usage_errors_do_not_import_torch(argv):
    # out-of-range sampling values, an empty stop string (exit 7) and a model that is not there
    # (exit 3) are refused before anything is loaded
    # `import clearlm` is lazy (PEP 562): help and a mistyped flag answer in ~0.5 s, not ~4 s
    code = (
        "import sys\nfrom clearlm.cli import main\nsys.argv = ['clearlm', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write(f'torch imported: {\"torch\" in sys.modules}')"
    )
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, timeout=120)
    assert proc.stderr.decode().endswith("torch imported: False"), proc.stderr


def test_lazy_package_still_reaches_submodules_and_bare_clearlm_helps_once():
    code = (
        "import clearlm, sys\nprint(clearlm.sampling.SamplingParams.__name__, "
        "clearlm.text.read_text_file.__name__, hasattr(clearlm, 'nope'))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    want = ["SamplingParams", "read_text_file", "False"]
    assert proc.stdout.decode().split() == want, proc.stderr
    bare = cli(COLUMNS="300")  # no command: the help, once
    assert bare.returncode == 0 and bare.stdout.count(b"Usage:") == 1, bare.stdout


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_on_stdout_is_one_error_line():
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "clearlm", "--help"],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    assert proc.returncode == 1
    assert proc.stderr.decode().strip().splitlines() == [
        "error: [Errno 28] No space left on device"
    ], proc.stderr


@pytest.mark.parametrize("command", [["info", "MODEL"], ["walkthrough"], ["--help"]])
def test_a_closed_stdout_ends_every_command_with_status_0(command, tiny_path):
    argv = [str(tiny_path) if a == "MODEL" else a for a in command]
    proc = subprocess.Popen(
        [sys.executable, "-m", "clearlm", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader is gone before the first line is written
    rc = proc.wait(timeout=300)
    stderr = proc.stderr.read().decode()
    assert rc == 0 and stderr == "", stderr


def test_prompt_option_like_llama_cpp(tiny_path):
    args = ("-m", str(tiny_path), "-n", "4", "--temperature", "0", "--json")
    positional = cli("generate", "Hello", *args)
    option = cli("generate", "-p", "Hello", *args)
    assert positional.returncode == option.returncode == 0, option.stderr
    assert json.loads(option.stdout)["token_ids"] == json.loads(positional.stdout)["token_ids"]
    assert json.loads(option.stdout)["prompt_token_ids"] == clearlm.load(tiny_path).encode("Hello")
    chat = cli("chat", "--prompt", "Hello", *args)
    assert chat.returncode == 0, chat.stderr
    both = cli("generate", "Hi", "-p", "Hello", *args)
    assert both.returncode == 2 and b"not both" in both.stderr


def test_more_threads_than_cpus_warns_and_still_runs(tiny_path):
    cpus = len(os.sched_getaffinity(0))
    proc = cli("generate", "-p", "Hi", "-m", str(tiny_path), "-n", "2", "-t", str(cpus + 1))
    assert proc.returncode == 0, proc.stderr
    warning = f"warning: --threads {cpus + 1} is more than the {cpus} CPUs here"
    assert warning in proc.stderr.decode()
    ok = cli("generate", "-p", "Hi", "-m", str(tiny_path), "-n", "2", "-t", "1")
    assert b"warning" not in ok.stderr


class _Terminal:
    """A stand-in for stdin at a terminal: isatty() is True, bytes come from a buffer."""

    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)

    def isatty(self) -> bool:
        return True


def test_dash_at_a_terminal_says_how_to_end_the_prompt(monkeypatch, capsys):
    from clearlm.cli.prompt_input import resolve_prompt

    monkeypatch.setattr(sys, "stdin", _Terminal(b"typed text\n"))
    assert resolve_prompt("-", None) == "typed text"  # the last newline dropped, as llama.cpp
    assert "reading the prompt from standard input; end with Ctrl-D" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"piped")))
    assert resolve_prompt("-", None) == "piped"
    assert capsys.readouterr().err == ""  # a pipe needs no hint


def test_absurd_thread_counts_are_refused_before_torch_sees_them(tiny_path):
    """`--threads 100000` crashed libgomp (segfault, exit 139): now a usage error, exit 2."""
    from clearlm.runtime.threads import MAX_THREADS, set_threads

    # a process of its own: were the count to reach torch, the crash would be this one's
    proc = cli_process("generate", "-p", "Hi", "-m", str(tiny_path), "-n", "2", "-t", "100000")
    assert proc.returncode == 2, proc.stderr
    err_lines = proc.stderr.decode().strip().splitlines()
    assert len(err_lines) == 1 and "--threads" in err_lines[0], err_lines
    before = torch.get_num_threads()
    with pytest.raises(SamplingParamsError, match=f"from 1 to {MAX_THREADS}"):
        set_threads(MAX_THREADS + 1)
    assert torch.get_num_threads() == before


def test_prompt_files_that_are_pipes_are_read(tmp_path, tiny_path):
    """`-f <(cmd)` and a FIFO are files to read, not 'not found'; the ids are the text's."""
    fifo = tmp_path / "prompt.fifo"
    os.mkfifo(fifo)
    args = ("-m", str(tiny_path), "-n", "2", "--temperature", "0", "--json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "clearlm", "generate", "-f", str(fifo), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:  # a non-blocking open fails (ENXIO) until clearlm opens the FIFO to read it
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert proc.poll() is None, proc.communicate()[1]  # it ended without reading
            assert time.monotonic() < deadline, "clearlm never opened the FIFO"
            time.sleep(0.05)
    os.write(fd, b"Hello\r\nthere")
    os.close(fd)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["prompt_token_ids"] == clearlm.load(tiny_path).encode("Hello\r\nthere")


def test_spinner_says_its_label_once_where_stderr_is_no_terminal(capsys) -> None:
    """A log or a pipe gets the label as a line (a build of minutes is not silent there); the
    animation is for terminals only."""
    from clearlm.cli.loader import spinner

    with spinner("building the compiled decode step (1-3 minutes, once)…", True):
        pass
    with spinner("never shown", False):
        pass
    assert capsys.readouterr().err == "building the compiled decode step (1-3 minutes, once)…\n"
