"""Malformed model files: every bad configuration value is an InvalidModelFileError (CLI exit
4) naming the file and the key, at load, never a Python traceback or NaN at generation."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from cli_in_process import run_clearlm
from gguf import GGUFValueType as T
from hf_tiny import TINY, save_tiny
from tiny_gguf import write_tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

import clearlm
from clearlm.errors import InvalidModelFileError, printable
from clearlm.loading.hf import inspect_hf, load_hf_model

GGUF_CASES = {  # name: (key, value, type, what the message must say)
    "head_count_0": ("llama.attention.head_count", 0, T.UINT32, "positive integer"),
    "block_count_str": ("llama.block_count", "two", T.STRING, "positive integer"),
    "context_0": ("llama.context_length", 0, T.UINT32, "positive integer"),
    "embedding_0": ("llama.embedding_length", 0, T.UINT32, "positive integer"),
    "ff_bool": ("llama.feed_forward_length", True, T.BOOL, "positive integer"),
    "eps_negative": ("llama.attention.layer_norm_rms_epsilon", -1.0, T.FLOAT32, "finite"),
    "eps_nan": ("llama.attention.layer_norm_rms_epsilon", math.nan, T.FLOAT32, "finite"),
    "base_0": ("llama.rope.freq_base", 0.0, T.FLOAT32, "finite"),
    "base_nan": ("llama.rope.freq_base", math.nan, T.FLOAT32, "finite"),
    "base_inf": ("llama.rope.freq_base", math.inf, T.FLOAT32, "finite"),
    "rope_dim_str": ("llama.rope.dimension_count", "x", T.STRING, "positive integer"),
    "heads_not_dividing": ("llama.attention.head_count", 3, T.UINT32, "not a multiple"),
}


def bad_gguf(tmp_path, name):
    key, value, vtype, _ = GGUF_CASES[name]
    return write_tiny_llama(tmp_path / f"{name}.gguf", overrides={key: (value, vtype)})


@pytest.mark.parametrize("name", sorted(GGUF_CASES))
def test_bad_gguf_value_refused_at_load(tmp_path, name):
    path = bad_gguf(tmp_path, name)
    key, _, _, want = GGUF_CASES[name]
    with pytest.raises(InvalidModelFileError) as e:
        clearlm.load(path)
    msg = str(e.value)
    assert path.name in msg and key in msg and want in msg, msg


@pytest.mark.parametrize("command", ["info", "generate"])
def test_bad_gguf_cli_exit_4(tmp_path, command):
    """The tester's inputs: head_count 0 was a ZeroDivisionError in both commands."""
    path = bad_gguf(tmp_path, "head_count_0")
    args = [str(path)] if command == "info" else ["-m", str(path), "hi"]
    proc = run_clearlm(command, *args, text=True)  # clearlm.cli.main, in this process
    assert proc.returncode == 4, proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    assert "llama.attention.head_count = 0" in err


def test_huge_context_length_loads_lazily(tmp_path):
    """context_length 2**32-1 used to allocate RoPE tables for every position (34 GB): the
    tables now grow on demand, and the numbers equal those of the same model at context 64."""
    small = clearlm.load(write_tiny_llama(tmp_path / "small.gguf"))
    huge = clearlm.load(
        write_tiny_llama(
            tmp_path / "huge.gguf", overrides={"llama.context_length": (2**32 - 1, T.UINT32)}
        )
    )
    assert huge.config.context_length == 2**32 - 1
    assert len(huge.transformer.rope.cos) <= 32768
    ids = [104, 101, 108, 108, 111]
    assert torch.equal(huge.logits(ids), small.logits(ids))


def test_rope_table_grows_with_identical_rows(monkeypatch):
    """A table grown past its first size holds the same rows as one built at full size."""
    from clearlm.model.positions import RotaryEmbedding

    full = RotaryEmbedding(16, 10000.0, 40)  # 40 < TABLE_START: built whole
    monkeypatch.setattr(RotaryEmbedding, "TABLE_START", 8)
    lazy = RotaryEmbedding(16, 10000.0, 40)
    assert len(full.cos) == 40 and len(lazy.cos) == 8
    pos = torch.tensor([3, 9, 39])
    cos, sin = lazy(pos)
    assert len(lazy.cos) == 40  # 8 → 64, capped at 40
    assert torch.equal(cos, full.cos[pos]) and torch.equal(sin, full.sin_rot[pos])


def test_new_cache_builds_the_tables_its_steps_read(tmp_path, monkeypatch):
    """The tables start small and a cache's creation grows them to its length, so prefill and
    decode steps against it never rebuild a buffer (a compiled step could not); the logits equal
    those of a model built with whole tables. The ahead-of-time step takes the tables as
    inputs and leaves them as they are (tests/runtime/test_aot.py)."""
    from clearlm.generation.loop import decode_step, prefill
    from clearlm.model.positions import RotaryEmbedding
    from clearlm.runtime.aot import AOTDecodeStep

    path = write_tiny_llama(tmp_path / "tiny.gguf")  # context 64
    whole = clearlm.load(path).transformer
    monkeypatch.setattr(RotaryEmbedding, "TABLE_START", 8)
    lazy = clearlm.load(path).transformer
    assert len(whole.rope.cos) == 64 and len(lazy.rope.cos) == 8
    caches = [net.new_cache(1, 20) for net in (whole, lazy)]
    assert len(lazy.rope.cos) == 32  # 8 → 16 → 32, the first size ≥ 20
    table = lazy.rope.cos
    ids = torch.tensor([[104, 101, 108, 108, 111]])
    outs = [[prefill(net, ids, cache)] for net, cache in zip((whole, lazy), caches, strict=True)]
    for t in range(12):
        for net, cache, out in zip((whole, lazy), caches, outs, strict=True):
            out.append(decode_step(net, torch.tensor([[t + 3]]), cache))
    assert lazy.rope.cos is table  # no step rebuilt it
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
    AOTDecodeStep(lazy)  # builds nothing until its first call
    assert lazy.rope.cos is table


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf-bad")
    save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), path)
    return path


def with_config(src, dst, change):
    """A copy of folder src in dst whose config.json is change(config dict)."""
    dst.mkdir()
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    raw = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(change(raw)))
    return dst


HF_CASES = {
    "json_list": (lambda c: [c], "JSON list"),
    "heads_0": (lambda c: {**c, "num_attention_heads": 0}, "num_attention_heads = 0"),
    "heads_3": (lambda c: {**c, "num_attention_heads": 3}, "not a multiple"),
    "layers_str": (lambda c: {**c, "num_hidden_layers": "2"}, "num_hidden_layers = '2'"),
    "hidden_float": (lambda c: {**c, "hidden_size": 64.5}, "hidden_size = 64.5"),
    "rope_params_str": (lambda c: {**c, "rope_parameters": "x"}, "rope_parameters = 'x'"),
    "eps_negative": (lambda c: {**c, "rms_norm_eps": -1}, "rms_norm_eps = -1"),
    "eps_nan": (lambda c: {**c, "rms_norm_eps": math.nan}, "rms_norm_eps = nan"),
    "theta_0": (
        lambda c: {**c, "rope_parameters": {"rope_type": "default", "rope_theta": 0}},
        "rope_parameters.rope_theta = 0",
    ),
    "factor_str": (
        lambda c: {**c, "rope_parameters": {"rope_type": "linear", "factor": "2"}},
        "rope_parameters.factor = '2'",
    ),
}


@pytest.mark.parametrize("name", sorted(HF_CASES))
def test_bad_hf_config_refused(hf_folder, tmp_path, name):
    change, needle = HF_CASES[name]
    folder = with_config(hf_folder, tmp_path / name, change)
    for read in (load_hf_model, inspect_hf):
        with pytest.raises(InvalidModelFileError) as e:
            read(folder)
        assert "config.json" in str(e.value) and needle in str(e.value), str(e.value)


def test_hf_huge_max_position_embeddings_loads(hf_folder, tmp_path):
    folder = with_config(
        hf_folder, tmp_path / "huge", lambda c: {**c, "max_position_embeddings": 10**12}
    )
    model = load_hf_model(folder).model
    assert model.config.context_length == 10**12
    assert len(model.rope.cos) <= 32768


@pytest.mark.parametrize("content", [b"", b"garbage bytes", b"\x08\x00\x00\x00\x00\x00\x00\x00{"])
def test_garbage_safetensors(hf_folder, tmp_path, content):
    folder = tmp_path / "garbage"
    folder.mkdir()
    (folder / "config.json").write_bytes((hf_folder / "config.json").read_bytes())
    (folder / "model.safetensors").write_bytes(content)
    for read in (load_hf_model, inspect_hf):
        with pytest.raises(InvalidModelFileError, match="not a readable safetensors"):
            read(folder)


def test_truncated_safetensors(hf_folder, tmp_path):
    folder = tmp_path / "truncated"
    folder.mkdir()
    (folder / "config.json").write_bytes((hf_folder / "config.json").read_bytes())
    data = (hf_folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelFileError, match="not a readable safetensors"):
        load_hf_model(folder)


def test_printable_escapes_control_characters():
    assert printable("nope\n\x1b[31mred.gguf") == "nope\\n\\x1b[31mred.gguf"
    assert printable("a\u2028b\tc") == "a\\u2028b\\tc"
    assert printable("café ünïcode") == "café ünïcode"
    assert str(InvalidModelFileError("x\ny")) == "x\\ny"


def test_cli_path_with_control_characters_stays_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "generate", "-m", "nope\n\x1b[31mred.gguf", "hi"],
        capture_output=True,
        text=True,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 3, err
    assert len(err.splitlines()) == 1 and "\x1b" not in err, err
    assert "nope\\n\\x1b[31mred.gguf" in err


def test_sinusoid_table_grows_with_identical_rows(monkeypatch):
    """XGLM's sinusoidal table is built for TABLE_START positions at most and grows on demand."""
    from clearlm.config import ModelConfig
    from clearlm.model.positions import RotaryEmbedding, sinusoidal_table
    from clearlm.model.transformer import Transformer

    monkeypatch.setattr(RotaryEmbedding, "TABLE_START", 8)
    config = ModelConfig(
        "xglm", 11, 8, 1, 2, 2, 4, 16, 1e-5, 40, True,
        position="sinusoidal", position_offset=2, norm="layer", ffn="mlp", activation="gelu",
    )  # fmt: skip
    model = Transformer(config).eval()
    assert len(model.sinusoids) == 10
    model(torch.zeros(1, 30, dtype=torch.long))
    assert len(model.sinusoids) == 32
    full = sinusoidal_table(42, 8, "fairseq")
    assert torch.equal(model.sinusoids, full[:32])


def test_garbage_scales_dequantize_without_numpy_warnings() -> None:
    """A Q8_0 block whose float16 scale is +inf (bytes of a broken file) dequantizes to NaN
    without numpy's 'invalid value encountered in multiply' on stderr: the file's one error
    line comes later (shape check or NaN logits)."""
    import warnings

    import numpy as np
    from gguf import GGMLQuantizationType

    from clearlm.loading.gguf import dequantize_tensor
    from clearlm.loading.gguf_file import GGUFTensor

    block = np.frombuffer(np.array([0x7C00], np.uint16).tobytes() + bytes(32), np.uint8)
    data = np.tile(block, (2, 1))  # (rows, bytes per row): 2 rows of one block each
    t = GGUFTensor("blk.0.attn_q.weight", GGMLQuantizationType.Q8_0, (32, 2), 64, data.size, 0,
                   data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning would raise here
        w = dequantize_tensor(t, "f.gguf")
    assert w.shape == (2, 32) and np.isnan(w).all()
