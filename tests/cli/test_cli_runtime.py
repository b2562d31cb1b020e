"""The command line a llama.cpp / ollama user expects: threads, the loading line, --quiet, help
that shows its defaults, --version, command order, info -m, and checks that fail before the
weights are read. A tiny GGUF keeps every CLI run to about a second."""

from __future__ import annotations

import io
import os
import subprocess
import time
from importlib.metadata import version

import pytest
import torch
from cli_in_process import run_clearlm
from rich.console import Console
from tiny_gguf import write_tiny_llama
from typer.testing import CliRunner

from clearlm.cli import app, loader
from clearlm.errors import ChatTemplateError, InvalidModelFileError, SamplingParamsError
from clearlm.loading.checkpoint import GGUFCheckpoint
from clearlm.runtime import threads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("rt") / "tiny.gguf", context_length=48)


@pytest.fixture(scope="module")
def no_template(tmp_path_factory):
    """A tiny model without a chat template, like Gemma 3 270M base."""
    path = tmp_path_factory.mktemp("nt") / "plain.gguf"
    return write_tiny_llama(path, context_length=48, chat_template=None)


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (a subprocess spends
    ~2.5 s importing torch; what is checked here is what a command prints and returns)."""
    return run_clearlm(*args, text=True, **env)


# ---- threads: the rule as a pure function, then applied ----


@pytest.mark.parametrize(
    "physical,allowed,busy,want",
    [
        (2, 2, 0.0, 2),  # an idle 2-core machine: both
        (2, 2, 0.4, 2),  # background noise rounds away
        (2, 2, 1.0, 1),  # one core busy elsewhere: one thread
        (2, 2, 1.7, 1),  # both busy (the second process): one thread, never zero
        (2, 2, 5.0, 1),
        (8, 4, 0.0, 4),  # taskset / a container allows 4 of 8 cores
        (4, 8, 0.0, 4),  # 8 hyper-threads, 4 physical cores
        (8, 8, 3.2, 5),
    ],
)
def test_choose_threads(physical, allowed, busy, want):
    assert threads.choose_threads(physical, allowed, busy) == want


def test_busy_cpus_reads_proc_stat(tmp_path, monkeypatch):
    # columns: user nice system idle iowait irq softirq steal
    before = "cpu  9 9 9 9 9 9 9 9\ncpu0 100 0 0 100 0 0 0 0\ncpu1 0 0 0 200 0 0 0 0\n"
    # cpu0: 50 busy + 50 idle; cpu1: 100 idle; cpu2 (not ours): all busy
    after = (
        "cpu  9 9 9 9 9 9 9 9\ncpu0 150 0 0 150 0 0 0 0\ncpu1 0 0 0 300 0 0 0 0\n"
        "cpu2 500 0 0 0 0 0 0 0\n"
    )
    stat = tmp_path / "stat"
    stat.write_text(before)
    own = [0.0]  # this process's CPU seconds, as os.times() gives them
    monkeypatch.setattr(threads.os, "times", lambda: os.times_result((own[0], 0, 0, 0, 0)))
    monkeypatch.setattr(threads.time, "sleep", lambda s: stat.write_text(after))
    # idle 150 of 200 jiffies over 2 CPUs: 2 × (1 − 150/200) = 0.5 busy CPUs
    assert threads.busy_cpus({0, 1}, stat_path=str(stat)) == pytest.approx(0.5)
    assert threads.busy_cpus({0}, stat_path=str(tmp_path / "missing")) == 0.0
    # a look taken earlier (at import) spans the work: this process's own CPU time is not
    # "other processes"; 0.2 s of it = 0.2 × SC_CLK_TCK jiffies, of the 50 busy ones
    stat.write_text(before)
    first = threads._look(str(stat))
    first = (first[0] - 1.0, *first[1:])  # a second ago: no new 0.1 s wait
    stat.write_text(after)
    own[0] = 0.2
    monkeypatch.setattr(threads.time, "sleep", lambda s: pytest.fail("waited"))
    tick = os.sysconf("SC_CLK_TCK")
    want = 2 * max(0.0, 50 - 0.2 * tick) / 200
    assert threads.busy_cpus({0, 1}, stat_path=str(stat), since=first) == pytest.approx(want)
    own[0] = 10.0  # more than the span: clamped at 0, never negative
    assert threads.busy_cpus({0, 1}, stat_path=str(stat), since=first) == 0.0


def test_set_threads(monkeypatch):
    old = torch.get_num_threads()
    try:
        assert threads.set_threads(1) == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert threads.set_threads(None) == torch.get_num_threads()  # left as torch read it
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setattr(threads, "busy_cpus", lambda cpus, **kw: float(len(cpus)))  # all busy
        assert threads.set_threads(None) == 1
        for bad in (0, -2, 1.5, True):
            with pytest.raises(SamplingParamsError, match="threads must be an integer"):
                threads.set_threads(bad)
    finally:
        torch.set_num_threads(old)


# ---- the loading line, --threads, --quiet ----


def test_loading_line_names_model_size_time_and_threads(tiny):
    # seeded: an unseeded draw ends at EOS on the first token about once in a thousand runs
    proc = cli("generate", "hello", "-m", str(tiny), "-n", "3", "--threads", "1", "--seed", "0")
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    size = loader.human_size(tiny.stat().st_size)
    # an F32 file: float32 weights, 4 bytes per value of the file's tensors
    held = loader.human_size(4 * sum(t.n_elements for t in GGUFCheckpoint(tiny).tensors))
    assert first.startswith(f"loading tiny.gguf ({size})… done in ") and first.endswith(
        f" s · 1 thread · float32 weights {held}"
    ), first
    assert "generated 3 tokens" in proc.stderr
    proc = cli("generate", "hello", "-m", str(tiny), "-n", "3", "-t", "2")
    # (a warning line may come first on a busy machine: 2 threads beyond the cores free now)
    loading = next(x for x in proc.stderr.splitlines() if x.startswith("loading"))
    assert loading.endswith(f" s · 2 threads · float32 weights {held}")
    # --dtype bfloat16: the label names the dtype the weights are held in, at 2 bytes a value
    proc = cli("generate", "hello", "-m", str(tiny), "-n", "1", "-t", "1", "--dtype", "bfloat16")
    half = loader.human_size(2 * sum(t.n_elements for t in GGUFCheckpoint(tiny).tensors))
    loading = next(x for x in proc.stderr.splitlines() if x.startswith("loading"))
    assert loading.endswith(f" s · 1 thread · bfloat16 weights {half}"), loading


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_quiet_prints_only_the_text(tiny, command):
    loud = cli(command, "hello", "-m", str(tiny), "-n", "4", "--temperature", "0")
    quiet = cli(command, "hello", "-m", str(tiny), "-n", "4", "--temperature", "0", "--quiet")
    assert loud.returncode == quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "" and "loading" in loud.stderr
    assert quiet.stdout == loud.stdout  # same text, only the chatter is gone


def test_perplexity_takes_threads_and_quiet(tiny, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello hello hello world, a small text to score.\n")
    proc = cli("perplexity", str(text), "-m", str(tiny), "--context", "16", "-t", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout.startswith("perplexity ")


def test_spinner_shows_on_a_terminal_only_when_slow(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(loader, "err", Console(file=screen, force_terminal=True, width=80))
    monkeypatch.setattr(loader, "SPINNER_AFTER_S", 0.05)
    with loader.spinner("loading big (1.1 GB)…", enabled=True):
        time.sleep(0.4)
    assert "loading big (1.1 GB)…" in screen.getvalue()
    screen.truncate(0)
    monkeypatch.setattr(loader, "SPINNER_AFTER_S", 5.0)
    with loader.spinner("loading small…", enabled=True):
        pass  # quicker than SPINNER_AFTER_S: nothing drawn
    assert "loading small" not in screen.getvalue()


@pytest.mark.parametrize(
    "n,text", [(0, "0 B"), (369_000, "369 kB"), (98_000_000, "98 MB"), (1_120_000_000, "1.1 GB")]
)
def test_human_size(n, text):
    assert loader.human_size(n) == text


# ---- help, --version, order, info -m ----


def test_help_shows_the_sampling_defaults():
    out = cli("generate", "--help", COLUMNS="200").stdout
    assert "0 = greedy (default 0.8; chat: 0 leaves out its default repetition penalty)." in out
    assert "Keep the k most likely tokens; 0 = off (default 0; chat 40)." in out
    assert "this much probability; 1 = off (default 1; chat 0.9)." in out
    assert "1 = off (default 1; chat 1.1)." in out
    chat = cli("chat", "--help", COLUMNS="200").stdout  # where chat's defaults come from
    assert "generation_config.json, else ollama's defaults (temperature 0.8, top-k 40" in chat
    assert "--threads" in out and "--quiet" in out


def test_version():
    proc = cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"clearlm {version('clearlm')}"


def test_generate_and_chat_come_first():
    out = cli("--help", COLUMNS="120").stdout
    listed = [
        line.split()[1]
        for line in out[out.index("Commands") :].splitlines()[1:]
        if line.startswith("│ ") and line[2] != " "
    ]
    assert listed[:2] == ["generate", "chat"], listed
    assert {"info", "models", "pull", "rm", "perplexity", "explain", "ui"} <= set(listed)


def test_info_takes_m_like_every_other_command(tiny):
    positional, option = cli("info", str(tiny)), cli("info", "-m", str(tiny))
    assert option.returncode == 0, option.stderr
    assert option.stdout == positional.stdout and "n_layers" in option.stdout
    both = cli("info", str(tiny), "-m", "gemma3-270m")
    assert both.returncode == 2 and "two models given" in both.stderr


# ---- checks on the header, before the weights ----


def test_chat_without_template_fails_before_the_weights(no_template, monkeypatch):

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights must not be loaded")

    import clearlm.loading.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint.GGUFCheckpoint, "load", no_weights)
    monkeypatch.setattr(checkpoint, "open_gguf", no_weights)  # not even the header
    res = CliRunner().invoke(app, ["chat", "hi", "-m", str(no_template)])
    assert isinstance(res.exception, ChatTemplateError), res.output
    assert str(res.exception) == (
        "plain.gguf has no chat template (a base model?); use `clearlm generate`"
    )


def test_chat_on_a_file_without_tokenizer_says_so_not_use_generate(tmp_path):
    """No template and no tokenizer keys either: `clearlm generate` cannot run it, so chat
    names the missing tokenizer instead of sending the user there."""
    from gguf import GGUFReader, GGUFWriter

    src = GGUFReader(str(write_tiny_llama(tmp_path / "full.gguf", chat_template=None)))
    out = GGUFWriter(str(tmp_path / "bare.gguf"), "llama")
    for field in src.fields.values():  # the sizes, not the tokenizer
        if field.name.startswith("llama."):
            out.add_key_value(field.name, field.contents(), field.types[0])
    for t in src.tensors:
        out.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    proc = cli("chat", "hi", "-m", str(tmp_path / "bare.gguf"))
    assert proc.returncode == InvalidModelFileError.exit_code
    assert proc.stderr.strip() == ("error: bare.gguf has no tokenizer (no tokenizer.ggml.* keys): "
                                   "it cannot encode text; use a complete GGUF")


def test_chat_without_template_is_one_line_and_no_loading(no_template):
    proc = cli("chat", "hi", "-m", str(no_template))
    assert proc.returncode == ChatTemplateError.exit_code
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error:") and "chat template" in line
    assert cli("generate", "hi", "-m", str(no_template), "-n", "2").returncode == 0


def test_too_long_prompt_fails_before_the_weights(tiny, monkeypatch):
    import clearlm.loading.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint.GGUFCheckpoint, "load", lambda *a, **k: pytest.fail("read"))
    res = CliRunner().invoke(app, ["generate", "x" * 60, "-m", str(tiny)])
    assert "context length is 48" in str(res.exception)


def test_load_opens_the_file_once_when_checking(tiny, monkeypatch):
    """The header read for the check is reused: one open, and the check sees no weights."""
    import clearlm
    import clearlm.loading.checkpoint as checkpoint

    opened, seen = [], []
    real = checkpoint.open_gguf

    def counting(path):
        opened.append(path)
        return real(path)

    monkeypatch.setattr(checkpoint, "open_gguf", counting)
    model = clearlm.load(tiny, check=lambda m: seen.append((m.transformer, m.encode("hello"))))
    assert len(opened) == 1 and seen == [(None, model.encode("hello"))]


# ---- reading only the key names ----


def test_gguf_keys_equal_the_gguf_readers(tiny, no_template, tmp_path):
    from gguf import GGUFReader

    from clearlm.loading.peek import gguf_keys, has_chat_template

    for path in (tiny, no_template):
        want = {k for k in GGUFReader(path).fields if not k.startswith("GGUF.")}
        assert gguf_keys(path) == want
    assert has_chat_template(tiny) is True and has_chat_template(no_template) is False
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:3000])  # inside the vocabulary array
    assert has_chat_template(text) is None and has_chat_template(cut) is None


@pytest.mark.parametrize("name,has", [("smollm2-135m-instruct", True), ("gemma3-270m", False)])
def test_real_models_chat_template_from_keys(name, has):
    from clearlm.loading.peek import has_chat_template
    from clearlm.store.catalog import ALIASES, locate

    path = locate(ALIASES[name])
    if path is None:
        pytest.skip(f"{name} not present: run `clearlm pull {name}` (make test does)")
    assert has_chat_template(path) is has
