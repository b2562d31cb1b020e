"""Bad input: every user mistake is a typed exception in the API and one line + non-zero exit in
the CLI, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_in_process import run_clearlm
from gguf import GGMLQuantizationType, GGUFWriter
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import (
    ContextLengthError,
    InvalidModelFileError,
    ModelNotFoundError,
    SamplingParamsError,
    UnsupportedModelError,
)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point (its one-line errors and exit codes), in
    this process: a subprocess spends ~2.5 s importing torch. A command that would serve or be
    signalled runs in a process of its own (cli_process)."""
    return run_clearlm(*args, text=True)


def cli_process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clearlm", *args], capture_output=True, text=True, timeout=300
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error:"), err
    for n in needles:
        assert n in err, err


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", context_length=32)


@pytest.fixture(scope="module")
def not_gguf(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("bad") / "notes.gguf"
    p.write_text("this is a text file, not a model\n")
    return p


@pytest.fixture(scope="module")
def truncated(tmp_path_factory, tiny) -> Path:
    p = tmp_path_factory.mktemp("trunc") / "cut.gguf"
    data = tiny.read_bytes()
    p.write_bytes(data[: len(data) - 1000])
    return p


@pytest.fixture(scope="module")
def other_arch(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("arch") / "mamba.gguf"
    w = GGUFWriter(str(p), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return p


@pytest.fixture(scope="module")
def odd_tensor_type(tmp_path_factory) -> Path:
    """A tiny llama whose matrices are F64, a type clearlm does not dequantize."""
    return write_tiny_llama(
        tmp_path_factory.mktemp("f64") / "f64.gguf", matrix_type=GGMLQuantizationType.F64)


def test_missing_path():
    with pytest.raises(ModelNotFoundError, match="not found"):
        clearlm.load("/no/such/model.gguf")
    assert_one_line_error(run_cli("generate", "hi", "--model", "/no/such/model.gguf"), "not found")


def test_folder_without_config_json(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        clearlm.load(tmp_path)


def test_folder_with_only_pickle_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "vocab_size": 8}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(UnsupportedModelError, match="safetensors only"):
        clearlm.load(tmp_path)


def test_folder_with_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(UnsupportedModelError, match="'bert' is not supported; supported: "):
        clearlm.load(tmp_path)


def test_not_a_gguf_file(not_gguf):
    with pytest.raises(InvalidModelFileError, match="not a GGUF file"):
        clearlm.load(not_gguf)
    assert_one_line_error(run_cli("info", str(not_gguf)), "not a GGUF file")


def test_truncated_gguf(truncated):
    with pytest.raises(InvalidModelFileError, match="truncated"):
        clearlm.load(truncated)
    assert_one_line_error(run_cli("generate", "hi", "--model", str(truncated)), "truncated")


def test_unsupported_architecture(other_arch):
    with pytest.raises(UnsupportedModelError, match="'mamba' is not supported; supported: llama"):
        clearlm.load(other_arch)
    assert_one_line_error(run_cli("info", str(other_arch)), "mamba", "supported: llama")


def test_unsupported_tensor_type(odd_tensor_type):
    with pytest.raises(UnsupportedModelError, match="F64"):
        clearlm.load(odd_tensor_type)
    proc = run_cli("generate", "hi", "--model", str(odd_tensor_type))
    assert_one_line_error(proc, "F64", "Q4_K", "IQ3_XXS")


def test_prompt_longer_than_context(tiny):
    model = clearlm.load(tiny)  # context_length 32, one token per byte
    with pytest.raises(ContextLengthError, match="context length is 32"):
        model.generate("x" * 40, max_new_tokens=4)
    proc = run_cli("generate", "x" * 40, "--model", str(tiny), "-n", "4")
    assert_one_line_error(proc, "40 tokens", "context length is 32")


def test_generation_stops_at_context_length(tiny):
    model = clearlm.load(tiny)
    res = model.generate("x" * 28, max_new_tokens=50, temperature=0)
    assert res.finish_reason in ("context_length", "eos")
    if res.finish_reason == "context_length":
        assert res.prompt_tokens + len(res.tokens) == 32


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--temperature", "-1", "temperature"),
        ("--top-p", "0", "top_p"),
        ("--top-p", "1.5", "top_p"),
        ("--top-k", "-3", "top_k"),
        ("--min-p", "2", "min_p"),
        ("--repetition-penalty", "0", "repetition_penalty"),
    ],
)
def test_invalid_sampling_values(tiny, flag, value, needle):
    proc = run_cli("generate", "hi", "--model", str(tiny), flag, value)
    assert_one_line_error(proc, needle)


def test_invalid_sampling_values_api(tiny):
    model = clearlm.load(tiny)
    with pytest.raises(SamplingParamsError, match="top_p"):
        model.generate("hi", top_p=0.0)


@pytest.mark.parametrize("value", [-5, 2.5, True])
def test_invalid_max_new_tokens_api(tiny, value):
    model = clearlm.load(tiny)
    with pytest.raises(SamplingParamsError, match="max_new_tokens"):
        model.generate("hi", max_new_tokens=value)


def test_empty_prompt_for_logits_and_distribution(tiny):
    model = clearlm.load(tiny)
    with pytest.raises(ContextLengthError, match="empty"):
        model.logits("")
    with pytest.raises(ContextLengthError, match="empty"):
        model.next_token_distribution("")


def test_params_and_keywords_together_are_refused(tiny):
    model = clearlm.load(tiny)
    with pytest.raises(SamplingParamsError, match="not both"):
        model.generate("hi", params=clearlm.SamplingParams(temperature=0), top_p=7)


def test_empty_conversation_is_refused(tiny):
    from clearlm.errors import ChatTemplateError

    with pytest.raises(ChatTemplateError, match="empty"):
        clearlm.load(tiny).chat([])


def test_dtype_by_name_and_unknown_dtype(tiny):
    import torch

    assert clearlm.load(tiny, dtype="bfloat16").transformer.lm_head.weight.dtype == torch.bfloat16
    with pytest.raises(SamplingParamsError, match="unknown dtype 'int8'"):
        clearlm.load(tiny, dtype="int8")


@pytest.mark.parametrize(
    "args,needle",
    [
        (("generate",), "give a PROMPT (or -p TEXT), '-' to read standard input, or -f FILE"),
        (("generate", "hi", "--bogus"), "No such option: --bogus"),
        (("generate", "hi", "-n", "-5"), "--max-new-tokens"),
        (("generate", "hi", "--seed", "abc"), "--seed"),
        (("generate", "hi", "--logprobs", "999999"), "Input should be less than or equal to 20"),
        (("nonsense",), "No such command"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert_one_line_error(proc, needle)


def test_ctrl_c_keeps_output_and_says_so(tmp_path):
    """SIGINT while generating: exit 130, the text so far kept, one line on stderr."""
    import signal

    # A long context and a million-token budget: it stops only at EOS, well after the signal.
    tiny = write_tiny_llama(tmp_path / "long.gguf", context_length=200_000)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clearlm",
            "generate",
            "hello",
            "--model",
            str(tiny),
            "-n",
            "1000000",
            "--seed",  # seed 3 draws 442 tokens before EOS (unseeded, EOS came after 1-400)
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a test run started in the background inherits SIGINT ignored, and Python then sets no
        # KeyboardInterrupt handler: give the child the default a user's shell gives
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stdout.read(1)  # blocks until text streams: generation is under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert first and proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err


def test_explain_unwritable_output_fails_before_work(tiny):
    proc = run_cli("explain", "hi", "--model", str(tiny), "--png", "/proc/nope/pics")
    assert_one_line_error(proc, "cannot write /proc/nope/pics")


def test_ui_busy_port_is_one_line(tiny):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = cli_process("ui", "--model", str(tiny), "--port", str(port))  # it could serve
    assert_one_line_error(proc, f"cannot serve on 127.0.0.1:{port}")


def test_serve_on_a_bad_address_is_one_line_without_the_key_warning(tiny):
    """An address that cannot be bound is the one line: the no-API-key warning (for a host
    other than loopback) comes only once the server can listen there."""
    proc = run_cli("serve", "--model", str(tiny), "--host", "999.1.1.1", "--port", "8124")
    assert_one_line_error(proc, "cannot serve on 999.1.1.1:8124")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_empty_stop_string_is_refused(tmp_path, command):
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    proc = run_cli(command, "-m", str(path), "--stop", "", "hi", "-n", "2")
    assert_one_line_error(proc, "stop string must not be empty")
    assert proc.returncode == SamplingParamsError.exit_code


def test_docs_list_every_error_class_and_exit_code():
    """docs/python-api.md's Errors paragraph names every ClearLMError subclass of clearlm.errors
    that has its own exit code, and its CLI list gives every exit code, in order (10,
    DeviceError, and 11, DistributedError, were missing)."""
    import re

    import clearlm.errors as errors

    readme = (Path(__file__).resolve().parents[2] / "docs/python-api.md").read_text("utf-8")
    start = readme.index("Errors are typed:")
    para = " ".join(readme[start : readme.index("\n\n", start)].split())  # one line
    base = errors.ClearLMError
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, base) and c is not base]  # fmt: skip
    own = [c for c in classes if "exit_code" in vars(c)]  # each with its own exit code
    missing = [c.__name__ for c in own if f"`{c.__name__}`" not in para]
    assert not missing, f"docs/python-api.md's error list lacks {missing}"
    codes = sorted({c.exit_code for c in classes} | {2})  # 2: typer's usage errors
    cli = para[para.index("exits non-zero:") :]
    listed = [int(n) for n in re.findall(r"[,:] (\d+) ", cli)]
    assert [n for n in listed if n < 100] == codes, listed
