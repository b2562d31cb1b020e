"""Issue 7.4 and 7.5: text that is not valid Unicode, and files read byte for byte.

Invalid bytes and lone surrogates become U+FFFD at every entry point (API, CLI arguments,
files, standard input, the web page); files keep their exact characters (no newline
translation). References: transformers' tokenizer and loss on a tiny folder, and the API's own
values for the CLI.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_tiny import TINY, save_tiny
from test_tokenizer_hf import _save, _train
from tiny_gguf import write_tiny_llama
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import clearlm
from clearlm.errors import ClearLMError
from clearlm.generation.perplexity import perplexity
from clearlm.text import clean_arg, clean_text, read_text_file
from clearlm.tokenizer import tokenizer_from_hf_folder

CRLF_TEXT = "Alice was beginning to get very tired.\r\nShe peeped into the book.\r\nSo she was.\r\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("text") / "tiny.gguf", context_length=64)


def cli(*args: str | bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clearlm", *args], capture_output=True, input=stdin, timeout=300
    )


def _no_traceback(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    return err


def _prompt_tokens(stderr: str) -> int:
    return int(stderr.split("prompt ")[1].split()[0])


# --- 7.4: invalid Unicode -------------------------------------------------------------------


def test_clean_text() -> None:
    assert clean_text("ok\ud800bad") == "ok\ufffdbad"
    assert clean_text("\udfff\ud800") == "\ufffd\ufffd"
    assert clean_text("\ud83d\ude00") == "\U0001f600"  # a pair written as two code points
    assert clean_text("plain é 你好") == "plain é 你好"
    with pytest.raises(ClearLMError, match="expected text"):
        clean_text(b"bytes")  # type: ignore[arg-type]


def test_clean_arg_restores_the_bytes() -> None:
    arg = os.fsdecode(b"caf\xe9 \xff ok")  # what sys.argv holds for $'caf\xe9 \xff ok'
    assert clean_arg(arg) == b"caf\xe9 \xff ok".decode("utf-8", "replace") == "caf\ufffd \ufffd ok"
    assert clean_arg(os.fsdecode("é €".encode())) == "é €"
    assert clean_arg("ok\ud800") == "ok\ufffd"  # not from argv: still cleaned


def test_api_encode_lone_surrogate(smollm2) -> None:
    assert smollm2.encode("ok\ud800bad") == smollm2.encode("ok\ufffdbad")
    assert smollm2.chat_prompt("ok\ud800bad") == smollm2.chat_prompt("ok\ufffdbad")
    res = smollm2.generate("ok\ud800bad", max_new_tokens=1, temperature=0)
    assert res.prompt_tokens == len(smollm2.encode("ok\ufffdbad"))


def test_cli_generate_invalid_bytes(tiny: Path) -> None:
    proc = cli("generate", b"caf\xe9 \xff ok", "-m", str(tiny), "-n", "2", "--temperature", "0")
    err = _no_traceback(proc)
    assert proc.returncode == 0, err
    assert _prompt_tokens(err) == len(clearlm.load(tiny).encode("caf\ufffd \ufffd ok"))


def test_cli_chat_and_explain_invalid_bytes(tiny: Path) -> None:
    model = clearlm.load(tiny)
    proc = cli("chat", b"caf\xe9", "--system", b"\xff", "-m", str(tiny), "-n", "1")
    err = _no_traceback(proc)
    assert proc.returncode == 0, err
    messages = [{"role": "system", "content": "\ufffd"}, {"role": "user", "content": "caf\ufffd"}]
    assert _prompt_tokens(err) == len(model.chat_prompt(messages))
    proc = cli("explain", b"caf\xe9 \xff", "-m", str(tiny), "--top", "2")
    assert proc.returncode == 0, _no_traceback(proc)


def test_ui_lone_surrogate(tiny: Path) -> None:
    from fastapi.testclient import TestClient

    from clearlm.ui import create_app

    model = clearlm.load(tiny)
    client = TestClient(create_app(model))
    body = b'{"prompt": "ok\\ud800bad"}'  # a JSON escape for a lone surrogate
    r = client.post("/api/analyze", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert [t["id"] for t in r.json()["tokens"]] == model.encode("ok\ufffdbad")
    r = client.post("/api/sample", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["prompt"].startswith("ok\ufffdbad")
    bad = b'{"prompt": "caf\xe9"}'  # not UTF-8 at all: refused with a message, not a crash
    r = client.post("/api/analyze", content=bad, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422) and set(r.json()) == {"error"}


def test_read_text_file(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfa\r\nb\rc\xff\n")
    warned = r"t.txt is not UTF-8 text \(invalid byte 0xff at offset 9\)"
    with pytest.warns(UserWarning, match=warned):
        assert read_text_file(path) == "\ufeffa\r\nb\rc\ufffd\n"  # exactly, BOM and CR kept
    with pytest.raises(ClearLMError, match=r"t.txt is not UTF-8 text \(invalid byte 0xff at"):
        read_text_file(path, strict=True)
    with pytest.raises(ClearLMError, match="text file not found"):
        read_text_file(tmp_path / "missing.txt")


def test_read_stdin_text() -> None:
    code = "from clearlm.text import read_stdin_text as r; print(ascii(r()))"
    proc = subprocess.run(
        [sys.executable, "-c", code], input=b"a\r\nb\xffc", capture_output=True, timeout=60
    )
    assert proc.stdout.decode().strip() == ascii("a\r\nb\ufffdc")
    warned = "standard input is not UTF-8 text (invalid byte 0xff at offset 4)"
    assert warned in proc.stderr.decode()


def test_cli_perplexity_non_utf8_file(tiny: Path, tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("café au lait, encore du café\n".encode("latin-1"))
    proc = cli("perplexity", str(path), "-m", str(tiny))
    err = _no_traceback(proc)
    assert proc.returncode == 1
    assert err.strip().splitlines() == [
        f"error: {path} is not UTF-8 text (invalid byte 0xe9 at offset 3); convert it to "
        "UTF-8, e.g. iconv -t utf-8"
    ]


# --- 7.5: files read with their exact characters --------------------------------------------


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> tuple[Path, LlamaForCausalLM]:
    path = tmp_path_factory.mktemp("crlf")
    backend = _train("byte")
    model = save_tiny(
        LlamaForCausalLM, LlamaConfig(**{**TINY, "vocab_size": backend.get_vocab_size()}), path
    )
    _save(backend, path)
    return path, model


def _cli_perplexity(path: Path, model: Path, context: int) -> tuple[float, int]:
    proc = cli("perplexity", str(path), "-m", str(model), "--context", str(context))
    err = _no_traceback(proc)
    assert proc.returncode == 0, err
    return float(proc.stdout.split()[-1]), int(err.split(" tokens predicted")[0].split()[-1])


def test_perplexity_keeps_crlf_against_transformers(tiny_folder, tmp_path: Path) -> None:
    folder, ref_model = tiny_folder
    path = tmp_path / "crlf.txt"
    path.write_bytes(CRLF_TEXT.encode())
    ids = AutoTokenizer.from_pretrained(folder).encode(CRLF_TEXT)  # the file's own text
    with torch.inference_mode():
        loss = ref_model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
    value, predicted = _cli_perplexity(path, folder, 128)  # one window
    assert predicted == len(ids) - 1
    assert value == pytest.approx(math.exp(loss), rel=1e-4)


def test_perplexity_crlf_on_the_default_model(smollm2, tmp_path: Path) -> None:
    path = tmp_path / "crlf.txt"
    path.write_bytes(CRLF_TEXT.encode())
    exact = perplexity(smollm2.transformer, smollm2.encode(CRLF_TEXT), 512)
    translated = perplexity(smollm2.transformer, smollm2.encode(CRLF_TEXT.replace("\r", "")), 512)
    assert exact.n_predicted != translated.n_predicted  # the test can tell the two apart
    value, predicted = _cli_perplexity(path, Path(smollm2.path), 512)
    assert predicted == exact.n_predicted == len(smollm2.encode(CRLF_TEXT)) - 1
    assert value == pytest.approx(exact.perplexity, rel=1e-4)


def test_crlf_model_files_read_as_transformers_reads_them(tmp_path: Path) -> None:
    """JSON configs with CRLF line ends load; a CRLF chat_template.jinja renders as
    transformers renders it (it reads templates with open()'s newline translation)."""
    _save(_train("byte"), tmp_path)
    config = tmp_path / "tokenizer_config.json"
    data = json.loads(config.read_bytes())
    config.write_bytes(json.dumps(data, indent=2).replace("\n", "\r\n").encode())
    template = "{% for m in messages %}<|user|>\r\n{{ m['content'] }}</s>\r\n{% endfor %}"
    (tmp_path / "chat_template.jinja").write_bytes(template.encode())
    ours, ref = tokenizer_from_hf_folder(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "a\r\nb"}]
    text = ref.apply_chat_template(messages, tokenize=False)
    assert ours.apply_chat_template(messages) == text
    assert ours.encode_chat(messages) == ref.encode(text, add_special_tokens=False)


def test_api_bytes_and_non_text_prompts(tiny: Path) -> None:
    model = clearlm.load(tiny)
    warned = r"prompt is not UTF-8 text \(invalid byte 0xe9 at offset 3"
    with pytest.warns(UserWarning, match=warned):
        assert model.encode(b"caf\xe9 \xff ok") == model.encode("caf\ufffd \ufffd ok")
    assert model.encode("café".encode()) == model.encode("café")
    with pytest.raises(ClearLMError, match="a prompt is text or a list of token ids, not None"):
        model.encode(None)  # type: ignore[arg-type]


def test_issue_cli_input_on_the_default_model(smollm2) -> None:
    proc = cli("generate", b"caf\xe9 \xff ok", "-n", "2", "--temperature", "0")
    err = _no_traceback(proc)
    assert proc.returncode == 0, err
    assert _prompt_tokens(err) == len(smollm2.encode("caf\ufffd \ufffd ok"))
