"""The command line as someone coming from llama.cpp or ollama types it: --temp,
--repeat-penalty, --n-predict, -c/--ctx-size, -ngl; `clearlm run` and `clearlm list`; a prompt
from standard input or -f without its last newline; a Hugging Face repo id; the alias in --json;
the --threads warning; `ui`'s port; the GGUF files in the cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import typer
from cli_in_process import run_clearlm
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.cli import app
from clearlm.cli.loader import model_label, threads_warning
from clearlm.cli.ollama import model_like
from clearlm.cli.prompt_input import drop_last_newline
from clearlm.cli.repl import banner, describe_sampling
from clearlm.errors import ModelNotFoundError
from clearlm.sampling.chain import SamplingParams
from clearlm.store.catalog import DEFAULT_MODEL


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("spell") / "tiny.gguf", context_length=64)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return clearlm.load(tiny_path)


def cli(*args: str, stdin: bytes | None = None, **env: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (what these tests check
    is what a command prints and returns; 50 subprocesses spent ~2.5 s each importing torch)."""
    return run_clearlm(*args, stdin=stdin, **env)


def as_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_llamacpp_spellings_run_as_clearlms_own(tiny, tiny_path):
    short = ("--temp", "0.7", "--repeat-penalty", "1.3", "--n-predict", "5")
    long = ("--temperature", "0.7", "--repetition-penalty", "1.3", "--max-new-tokens", "5")
    outs = [as_json(cli("generate", "hello", "-m", str(tiny_path), "--seed", "4", "--json", *a))
            for a in (short, long)]
    want = tiny.generate("hello", max_new_tokens=5, temperature=0.7, repetition_penalty=1.3,
                         seed=4)
    for out in outs:
        assert out["token_ids"] == want.tokens
        assert out["sampling"]["temperature"] == 0.7
        assert out["sampling"]["repetition_penalty"] == 1.3
    chat = as_json(cli("chat", "hi", "-m", str(tiny_path), "--json", "--temp", "0", "-n", "3"))
    assert chat["token_ids"] == tiny.chat("hi", max_new_tokens=3, temperature=0).tokens


@pytest.mark.parametrize("flag", [("-ngl", "99"), ("--n-gpu-layers", "99"), ("-ngl=20",)])
@pytest.mark.parametrize("command", ["generate", "chat", "run"])
def test_gpu_layers_are_answered_with_device(command, flag, tiny_path):
    proc = cli(command, "hi", "-m", str(tiny_path), *flag)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "clearlm has no layer offload" in err and "--device" in err
    assert "integer" not in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_ctx_size_limits_prompt_and_answer(tiny, tiny_path):
    prompt = tiny.encode("hello world")
    greedy = tiny.generate("hello world", max_new_tokens=20, temperature=0)
    assert greedy.finish_reason == "length"  # -n 20 alone fits in the model's 64
    for flag in ("-c", "--ctx-size"):
        out = as_json(cli("generate", "hello world", "-m", str(tiny_path), "-n", "20",
                          "--temperature", "0", "--json", flag, str(len(prompt) + 3)))
        assert out["token_ids"] == greedy.tokens[:3]  # the same tokens, cut at the context
        assert out["finish_reason"] == "context_length"
    out = as_json(cli("generate", "hello world", "-m", str(tiny_path), "-n", "4",
                      "--temperature", "0", "--json", "-c", "0"))  # 0: the model's context
    assert out["token_ids"] == greedy.tokens[:4] and out["finish_reason"] == "length"
    proc = cli("generate", "hello world", "-m", str(tiny_path), "-c", str(len(prompt) - 1))
    assert proc.returncode == 6
    assert proc.stderr.decode().strip() == (
        f"error: the prompt has {len(prompt)} tokens but the context size (-c) is "
        f"{len(prompt) - 1}; shorten the prompt"
    )
    proc = cli("generate", "hello world", "-m", str(tiny_path), "-n", "2", "-c", "1000")
    assert proc.returncode == 0, proc.stderr
    assert "warning: -c 1000 is past the model's context length; the context holds 64" in (
        proc.stderr.decode())


def test_ctx_size_in_a_conversation(tiny, tiny_path):
    """Each answer fits -c; a turn whose prompt no longer fits is refused, the rest go on, and
    the exit code says a turn failed (a piped chat: ContextLengthError's 6)."""
    n = len(tiny.chat_prompt("hi"))
    proc = cli("chat", "-m", str(tiny_path), "-n", "10", "--temperature", "0", "-c",
               str(n + 2), stdin=b"hi\nhi again, a longer message\n")
    assert proc.returncode == 6, proc.stderr
    first = tiny.chat("hi", max_new_tokens=2, temperature=0).text
    assert proc.stdout.decode() == first + "\n"
    err = proc.stderr.decode()
    assert "finish: context_length" in err
    assert "but the context size (-c) is" in err and "/reset starts a new conversation" in err


def test_run_is_chat_with_the_model_first(tiny, tiny_path):
    greedy = ("-n", "3", "--temperature", "0", "--json")
    want = tiny.chat("hi", max_new_tokens=3, temperature=0).tokens
    assert as_json(cli("run", str(tiny_path), "hi", *greedy))["token_ids"] == want
    assert as_json(cli("run", "-m", str(tiny_path), "hi", *greedy))["token_ids"] == want
    assert as_json(cli("run", str(tiny_path), "-p", "hi", *greedy))["token_ids"] == want
    proc = cli("run", str(tiny_path), "-m", str(tiny_path), "hi")
    assert proc.returncode == 2 and b"give the model once" in proc.stderr
    proc = cli("run", str(tiny_path), "-n", "3", "--temperature", "0", "-q", stdin=b"hi\n")
    assert proc.returncode == 0, proc.stderr  # no message: the conversation
    assert proc.stdout.decode() == tiny.chat("hi", max_new_tokens=3, temperature=0).text + "\n"


def test_run_with_a_message_for_a_model_says_the_model_comes_first(tiny_path):
    """ollama's users write `run "Hi"`: the not-found line adds how run is spelled."""
    assert not model_like("Hi") and not model_like("What is 2+2?")
    assert model_like("smollm2-135m-instruct") and model_like(str(tiny_path))
    assert model_like("llama3") and model_like("model.gguf")
    proc = cli("run", "What is 2+2?", "-n", "1")
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 3 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: model 'What is 2+2?' not found: not a file")
    assert lines[0].endswith(
        "; `run` takes the model first: clearlm run MODEL [PROMPT] "
        "(the default model: clearlm chat 'What is 2+2?')"
    )
    proc = cli("run", "llama3", "-n", "1")  # model-like: the plain line
    assert proc.returncode == 3 and b"takes the model first" not in proc.stderr


def test_list_is_models_and_shows_the_cache_ggufs(tmp_path, tiny_path):
    shutil.copy(tiny_path, tmp_path / "mine.gguf")
    shutil.copy(tiny_path, tmp_path / "gemma-3-270m-q4_k_m.gguf")  # an alias's: listed once
    (tmp_path / "notes.txt").write_text("not a model")
    listed = cli("list", "--cache-dir", str(tmp_path))
    models = cli("models", "--cache-dir", str(tmp_path))
    assert listed.returncode == models.returncode == 0, listed.stderr
    assert listed.stdout == models.stdout
    out = listed.stdout.decode()
    mine = f"  {tmp_path / 'mine.gguf'}  369 kB"
    assert f"Other GGUF files in the cache (-m PATH runs one):\n{mine}" in out
    assert out.count("gemma-3-270m-q4_k_m.gguf") == 1  # under "Files:" with its alias
    assert "notes.txt" not in out


@pytest.mark.parametrize("where", ["stdin", "file"])
def test_one_last_newline_of_a_prompt_is_dropped(where, tiny, tiny_path, tmp_path):
    args = ("-m", str(tiny_path), "-n", "1", "--temperature", "0", "--json")
    for raw, text in ((b"q\n", "q"), (b"q\r\n", "q"), (b"q\n\n", "q\n"), (b"q", "q")):
        if where == "stdin":
            out = as_json(cli("generate", "-", *args, stdin=raw))
        else:
            (tmp_path / "p.txt").write_bytes(raw)
            out = as_json(cli("generate", "-f", str(tmp_path / "p.txt"), *args))
        assert out["prompt_token_ids"] == tiny.encode(text), raw
    assert as_json(cli("generate", "q", *args))["prompt_token_ids"] == tiny.encode("q")
    assert drop_last_newline("a\r\n\r\n") == "a\r\n" and drop_last_newline("a\r") == "a\r"


def test_perplexity_keeps_its_file_exact(tiny_path, tmp_path):
    """Only prompts lose their last newline: perplexity scores every token of its file. Run in
    this process (CliRunner): six subprocesses would spend ~20 s importing torch."""
    from typer.testing import CliRunner

    def perplexity(*flags: str):
        res = CliRunner().invoke(app, ["perplexity", str(tmp_path / "t.txt"), "-m",
                                       str(tiny_path), *flags])  # fmt: skip
        assert res.exit_code == 0, res.output
        return res

    counts = []
    for raw in (b"hello world hello\n", b"hello world hello"):
        (tmp_path / "t.txt").write_bytes(raw)
        counts.append(int(perplexity().stderr.split(" tokens predicted")[0].split()[-1]))
    assert counts[0] == counts[1] + 1
    spelled = [perplexity(flag, "4").stdout
               for flag in ("--context", "-c", "--ctx-size")]  # llama-perplexity's -c: the window
    assert spelled[0] == spelled[1] == spelled[2] != perplexity().stdout


def test_a_hugging_face_repo_id_says_clearlm_never_downloads(tmp_path, monkeypatch):
    proc = cli("chat", "hi", "-m", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert proc.returncode == 3
    err = proc.stderr.decode()
    assert "clearlm never downloads: pass a .gguf path or a folder" in err
    assert len(err.splitlines()) == 1
    with pytest.raises(ModelNotFoundError, match="never downloads"):
        clearlm.load("Qwen/Qwen2.5-0.5B-Instruct")
    folder = tmp_path / "owner"
    (folder / "missing").mkdir(parents=True)  # an existing folder of that form is a path
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError) as e:
        clearlm.load("owner/missing")
    assert "never downloads" not in str(e.value)


def test_banners_and_json_name_the_alias_not_a_site_packages_path(tiny_path):
    assert model_label(None) == DEFAULT_MODEL
    assert model_label("gemma3-270m") == "gemma3-270m"
    assert model_label(str(tiny_path)) == str(tiny_path)  # a path: as the user gave it
    out = as_json(cli("chat", "hi", "-m", str(tiny_path), "-n", "1", "--json"))
    assert out["model"] == out["model_path"] == str(tiny_path)


def test_json_names_the_default_models_alias(smollm2_path):
    out = as_json(cli("generate", "Hi", "-n", "1", "--json", "--temperature", "0"))
    assert out["model"] == DEFAULT_MODEL
    assert out["model_path"] == str(smollm2_path)


def test_threads_beyond_the_free_cores_are_warned():
    assert threads_warning(2, cpus=4, free=4) is None
    assert threads_warning(3, cpus=4, free=2) == (
        "--threads 3 is more than the 2 cores free now (other processes keep the rest busy); "
        "decoding may be slower than with --threads 2")
    assert threads_warning(1, cpus=4, free=1) is None
    assert "more than the 4 CPUs here" in threads_warning(5, cpus=4, free=1)


def test_the_threads_warning_reaches_the_command_line(tiny_path, monkeypatch):
    """With the free cores made 1 (clearlm.runtime.threads.default_threads), -t 2 is warned about
    (when this machine has 2 CPUs or more: else the CPUs warning, also tested above)."""
    import torch
    from typer.testing import CliRunner

    import clearlm.runtime.threads

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    before = torch.get_num_threads()
    monkeypatch.setattr(clearlm.runtime.threads, "default_threads", lambda: 1)
    try:
        res = CliRunner().invoke(app, ["generate", "hi", "-m", str(tiny_path), "-n", "1",
                                       "-t", "2"])
    finally:
        torch.set_num_threads(before)
    assert res.exit_code == 0, res.output
    assert "--threads 2 is more than the 1 core free now" in res.output


def test_ui_and_serve_default_to_different_ports():
    command = typer.main.get_command(app)
    port = {name: next(p.default for p in command.commands[name].params if p.name == "port")
            for name in ("ui", "serve")}
    assert port == {"ui": 8001, "serve": 8000}


def test_the_conversation_banner_says_how_it_samples():
    ollama = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)
    assert describe_sampling(ollama) == (
        "temperature 0.8 · top-k 40 · top-p 0.9 · repetition penalty 1.1")
    assert describe_sampling(SamplingParams(temperature=0, top_k=40)) == "greedy"
    assert describe_sampling(SamplingParams(temperature=0, repetition_penalty=1.3)) == (
        "greedy · repetition penalty 1.3")


def test_the_conversation_banner_is_dim_text_not_markup():
    """The banner is styled as a whole (no literal ``[dim]``) and a path with brackets stays."""
    from rich.console import Console

    line = banner("models/[q4]/m.gguf", SamplingParams(temperature=0))
    assert line.style == "dim"
    console = Console(force_terminal=True, color_system="standard", width=400)
    with console.capture() as cap:
        console.print(line, soft_wrap=True)
    shown = cap.get()
    assert "[dim]" not in shown and "chat with models/[q4]/m.gguf · greedy · /reset" in shown
    assert "\x1b[2m" in shown  # the terminal's dim attribute
