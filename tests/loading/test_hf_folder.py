"""A whole Hugging Face folder through clearlm.load: sharded safetensors, tokenizer.json,
generation_config.json defaults, and the CLI on it."""

from __future__ import annotations

import json

import pytest
import torch
from cli_in_process import run_clearlm
from hf_tiny import TINY, save_tiny
from test_tokenizer_hf import _save, _train
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import clearlm
from clearlm.sampling.defaults import CHAT_DEFAULTS, GENERATE_DEFAULTS

TEXT = "Alice was beginning to get very tired"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Llama saved in 100 kB shards, with a trained byte-level tokenizer and a
    generation_config.json that sets top_k and top_p."""
    path = tmp_path_factory.mktemp("hf-folder")
    backend = _train("byte")
    config = LlamaConfig(**{**TINY, "vocab_size": backend.get_vocab_size()})
    model = save_tiny(LlamaForCausalLM, config, path)
    model.save_pretrained(path, max_shard_size="100KB")  # re-save sharded
    for single in path.glob("model.safetensors"):
        single.unlink()
    _save(backend, path)
    (path / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "top_k": 7, "top_p": 0.8, "bos_token_id": 1})
    )
    return path


def test_folder_is_sharded(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1


def test_load_folder_matches_transformers(folder):
    ours = clearlm.load(folder)
    ref_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ref_tok = AutoTokenizer.from_pretrained(folder)
    ids = ours.encode(TEXT)
    assert ids == ref_tok.encode(TEXT)
    with torch.inference_mode():
        ref = ref_model(torch.tensor([ids])).logits[0]
    assert (ours.logits(ids) - ref).abs().max().item() <= 1e-4
    got = ours.generate(TEXT, max_new_tokens=12, temperature=0).tokens
    with torch.inference_mode():
        out = ref_model.generate(
            torch.tensor([ids]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=sorted(ours.tokenizer.eos_ids),
            pad_token_id=ours.tokenizer.eos_id,  # not 0: that is BOS here, and would be masked
        )
    assert got == out[0, len(ids) :].tolist()


def test_generation_config_sets_defaults(folder):
    """{"do_sample": true, "top_k": 7, "top_p": 0.8}: transformers samples at its default
    temperature 1.0 (not clearlm's 0.8), in generate and chat alike; the caller still wins."""
    model = clearlm.load(folder)
    assert model.generation_defaults == {
        "temperature": 1.0,
        "top_k": 7,
        "top_p": 0.8,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    }
    for fallback in (GENERATE_DEFAULTS, CHAT_DEFAULTS):
        params = model.sampling_params(None, fallback)
        assert (params.temperature, params.top_k, params.top_p) == (1.0, 7, 0.8)
    assert model.sampling_params(None, CHAT_DEFAULTS, top_k=3).top_k == 3  # the caller wins
    assert model.sampling_params(None, GENERATE_DEFAULTS, temperature=0).is_greedy


def test_cli_on_a_folder(folder):
    info = run_clearlm("info", str(folder), text=True)  # clearlm.cli.main, in this process
    assert info.returncode == 0, info.stderr
    assert "Llama" in info.stdout and "tokenizer.json" in info.stdout
    assert "Generation defaults" in info.stdout
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in info.stdout.splitlines()]
    rows = {c[0]: c[1:] for c in cells if len(c) == 4}  # setting → generate, chat, source
    assert rows["temperature"] == ["1", "1", "transformers default"]
    assert rows["top_k"] == ["7", "7", "generation_config.json"]
    gen = run_clearlm("generate", TEXT, "-m", str(folder), "-n", "5", "--seed", "0", text=True)
    assert gen.returncode == 0, gen.stderr
    assert "generated 5 tokens" in gen.stderr


def test_open_checkpoint_chooses_the_format_once(folder, tmp_path):
    """One opener for load, info and perplexity: a folder reads config.json and the
    safetensors headers, a .gguf file its metadata; the header is what the weights load with."""
    from tiny_gguf import write_tiny_llama

    from clearlm.loading.checkpoint import FolderCheckpoint, GGUFCheckpoint, open_checkpoint
    from clearlm.loading.hf import load_hf_model

    ckpt = open_checkpoint(folder)
    assert isinstance(ckpt, FolderCheckpoint) and ckpt.has_chat_template() is None
    loaded = ckpt.load()
    assert ckpt.config == loaded.config == load_hf_model(folder).config
    assert {t.name for t in ckpt.tensors} == {t.name for t in loaded.tensors}
    assert ckpt.generation_config.values["top_k"] == 7
    assert ckpt.size_bytes == sum(f.stat().st_size for f in folder.glob("*.safetensors"))

    path = write_tiny_llama(tmp_path / "tiny.gguf", context_length=48)
    ckpt = open_checkpoint(path)
    assert isinstance(ckpt, GGUFCheckpoint) and ckpt.has_chat_template() is True
    assert ckpt.config.context_length == 48 and ckpt.generation_config.values == {}
    loaded = ckpt.load()
    assert loaded.config is ckpt.config and loaded.metadata is ckpt.metadata
    assert ckpt.size_bytes == path.stat().st_size


def test_chat_samples_with_the_files_values(folder, tmp_path):
    """clearlm chat (and the server's chat endpoint, given no sampling field) take a folder's
    generation_config.json values; a GGUF file, which has none, takes ollama's defaults; an
    option the user gives wins, and --temperature 0 is greedy."""
    from tiny_gguf import write_tiny_llama

    from clearlm.serve.requests import sampling_params
    from clearlm.serve.schemas import ChatBody, CompletionBody

    file_values = {"temperature": 1.0, "top_k": 7, "top_p": 0.8, "min_p": 0.0,
                   "repetition_penalty": 1.0}  # do_sample, top_k, top_p; the rest transformers'
    ollama = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0,
              "repetition_penalty": 1.1}
    gguf = write_tiny_llama(tmp_path / "tiny.gguf", context_length=64)
    run = ["chat", "Hi", "-n", "2", "--json"]  # clearlm.cli.main, in this process
    for model, want in ((folder, file_values), (gguf, ollama)):
        proc = run_clearlm(*run, "-m", str(model), text=True)
        assert proc.returncode == 0, proc.stderr
        sampling = json.loads(proc.stdout)["sampling"]
        assert {k: sampling[k] for k in want} == want and sampling["seed"] is None
        m = clearlm.load(model)
        chat = ChatBody(model="x", messages=[{"role": "user", "content": "Hi"}])
        got = sampling_params(m, chat, 1)[0]
        assert {k: getattr(got, k) for k in want} == want
        given = ChatBody(model="x", messages=[{"role": "user", "content": "Hi"}], top_p=0.5)
        got = sampling_params(m, given, 1)[0]  # a field given: it wins, the rest as above
        assert {k: getattr(got, k) for k in want} == {**want, "top_p": 0.5}
        greedy = ChatBody(model="x", messages=[{"role": "user", "content": "Hi"}], temperature=0)
        got = sampling_params(m, greedy, 1)[0]
        assert got.is_greedy and got.repetition_penalty == 1.0  # plain greedy, no default penalty
        completion = sampling_params(m, CompletionBody(model="x", prompt="Hi"), 1)[0]
        assert completion.repetition_penalty == 1.0  # completions keep their defaults
    proc = run_clearlm(*run, "-m", str(gguf), "--temperature", "0", "--top-k", "3", text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["sampling"]["temperature"] == 0 and out["sampling"]["top_k"] == 3
    assert out["sampling"]["repetition_penalty"] == 1.0  # greedy: the model's own argmax
    assert out["token_ids"] == m.chat("Hi", max_new_tokens=2, temperature=0).tokens  # greedy
