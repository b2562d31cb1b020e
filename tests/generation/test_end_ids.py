"""Issue 7.2: every id that ends generation, from every source, each an int or a list.

config.json, generation_config.json, tokenizer_config.json's eos_token, and a GGUF's
eos / eot / eom ids all add to ``tokenizer.eos_ids``; generation stops at the first of any.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import pytest
import torch
from hf_tiny import TINY, save_tiny
from test_tokenizer_hf import _save, _train
from tiny_gguf import write_tiny_llama
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import clearlm
from clearlm.errors import InvalidModelFileError
from clearlm.loading.gguf import open_gguf, read_metadata
from clearlm.tokenizer import tokenizer_from_gguf, tokenizer_from_hf_folder

PROMPT = "Alice was"


def _folder(path: Path, **config_extra) -> Path:
    """A tiny Llama folder with the trained byte-level tokenizer (</s> = 1, <|user|> = 3) and
    no generation_config.json."""
    backend = _train("byte")
    config = LlamaConfig(**{**TINY, "vocab_size": backend.get_vocab_size(), **config_extra})
    save_tiny(LlamaForCausalLM, config, path)
    _save(backend, path)
    (path / "generation_config.json").unlink(missing_ok=True)
    return path


@pytest.fixture(scope="module")
def eos_list_folder(tmp_path_factory) -> Path:
    """The issue's folder: config.json says "eos_token_id": [1, 3]."""
    path = _folder(tmp_path_factory.mktemp("eos-list"), eos_token_id=[1, 3])
    assert json.loads((path / "config.json").read_text())["eos_token_id"] == [1, 3]
    assert not (path / "generation_config.json").exists()
    return path


def _force(token: int, after: int):
    """A logits hook that makes greedy decoding pick ``token`` once ``after`` tokens are in."""

    def hook(logits: torch.Tensor, _: str) -> torch.Tensor:  # (B, T, V), once per forward pass
        hook.calls += 1
        if hook.calls > after:
            logits = logits.clone()
            logits[..., token] = logits.max() + 10.0
        return logits

    hook.calls = 0
    return hook


def test_config_eos_list_is_read_whole(eos_list_folder: Path) -> None:
    tok = tokenizer_from_hf_folder(eos_list_folder)
    assert tok.eos_ids == {1, 3}
    # the reference: transformers' generation config of the same folder
    ref = AutoModelForCausalLM.from_pretrained(eos_list_folder).generation_config
    assert set(ref.eos_token_id) == tok.eos_ids


@pytest.mark.parametrize("end", [1, 3])
def test_generation_ends_at_either_id(eos_list_folder: Path, end: int) -> None:
    model = clearlm.load(eos_list_folder)
    free = model.generate(PROMPT, max_new_tokens=6, temperature=0)
    handle = model.add_hook("logits", _force(end, after=2))
    try:
        res = model.generate(PROMPT, max_new_tokens=6, temperature=0)
    finally:
        handle.remove()
    assert res.finish_reason == "eos"
    assert res.tokens == [*free.tokens[:2], end]


def test_end_ids_are_the_union_of_every_file(tmp_path: Path) -> None:
    path = _folder(tmp_path, eos_token_id=1)
    config = json.loads((path / "config.json").read_text())
    config["text_config"] = {"eos_token_id": [2]}  # multimodal configs nest the text model's
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 1]}))
    tc = json.loads((path / "tokenizer_config.json").read_text())
    tc["eos_token"] = "<|assistant|>"
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
    tok = tokenizer_from_hf_folder(path)
    assistant = tok.backend.token_to_id("<|assistant|>")
    assert tok.eos_id == assistant
    assert tok.eos_ids == {1, 2, 3, assistant}


def test_bad_end_id_value_is_a_typed_error(tmp_path: Path) -> None:
    path = _folder(tmp_path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(InvalidModelFileError, match="eos_token_id '</s>' is not an int or a list"):
        tokenizer_from_hf_folder(path)


@pytest.mark.parametrize(
    ("file", "value", "bad"),
    [
        ("config.json", 100000, 100000),
        ("config.json", -1, -1),
        ("generation_config.json", [1, 600], 600),
    ],
)
def test_hf_end_id_outside_vocabulary(tmp_path: Path, file: str, value, bad: int) -> None:
    """The tester's inputs (vocab 600): 100000 and -1 were accepted and never matched."""
    path = _folder(tmp_path)
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 600
    data = json.loads((path / file).read_text()) if (path / file).exists() else {}
    (path / file).write_text(json.dumps({**data, "eos_token_id": value}))
    with pytest.raises(InvalidModelFileError) as e:
        tokenizer_from_hf_folder(path)
    assert f"{file}: eos_token_id {bad} is outside the vocabulary" in str(e.value)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("eot") / "t.gguf", context_length=64)


def test_gguf_eot_and_eom_ids_end_generation(tiny_gguf: Path) -> None:
    meta = read_metadata(open_gguf(tiny_gguf))
    tokens = meta["tokenizer.ggml.tokens"]
    he, ll = tokens.index("he"), tokens.index("ll")  # ordinary tokens, made end ids here
    base = tokenizer_from_gguf(meta).eos_ids
    assert base == {tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")}
    meta[gguf.Keys.Tokenizer.EOT_ID] = he
    meta[gguf.Keys.Tokenizer.EOM_ID] = [ll]  # a list is read whole too
    tok = tokenizer_from_gguf(meta)
    assert tok.eos_ids == base | {he, ll}
    model = clearlm.load(tiny_gguf)
    model.tokenizer = tok
    free = model.generate("ab", max_new_tokens=6, temperature=0)
    for end in (he, ll):
        handle = model.add_hook("logits", _force(end, after=1))
        try:
            res = model.generate("ab", max_new_tokens=6, temperature=0)
        finally:
            handle.remove()
        assert res.finish_reason == "eos" and res.tokens == [*free.tokens[:1], end]


def test_gguf_end_id_outside_vocabulary(tiny_gguf: Path) -> None:
    meta = read_metadata(open_gguf(tiny_gguf))
    meta[gguf.Keys.Tokenizer.EOT_ID] = [2, 10**6]
    with pytest.raises(InvalidModelFileError, match="eot_token_id 1000000 is outside"):
        tokenizer_from_gguf(meta)


def test_info_shows_end_ids(eos_list_folder: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "clearlm", "info", str(eos_list_folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if "end ids" in line)
    assert "1 '</s>'" in row and "3 '<|user|>'" in row
