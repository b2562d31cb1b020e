"""GGUF metadata that changes the numbers is read or refused, never ignored (issue 7, item 1).

The walk: every ``{arch}.*`` key the ``gguf`` package defines (gguf.constants.Keys, the names
llama.cpp's llama-arch.cpp uses), set to a non-default value in a tiny file of every
architecture, either changes the loaded config or is refused with an error naming the key; only
the keys loading/gguf_keys.py lists as inert may do neither. Parity of the mapped keys with
transformers is in test_gguf_parity.py.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_keys_writer import add_key

from clearlm.errors import UnsupportedModelError
from clearlm.families import ARCHITECTURES
from clearlm.loading.checkpoint import open_checkpoint
from clearlm.loading.gguf_keys import INERT_KEYS

SIZES = {
    "block_count": 4,
    "context_length": 64,
    "embedding_length": 64,
    "feed_forward_length": 128,
    "attention.head_count": 4,
    "attention.head_count_kv": 2,
    "vocab_size": 320,
}
MOE = {"expert_count": 4, "expert_used_count": 2}
EXTRA = {
    "gemma2": {"attention.sliding_window": 4},
    "gemma3": {"attention.sliding_window": 4},
    "qwen2moe": MOE | {"expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 48},
    "qwen3moe": MOE | {"expert_feed_forward_length": 32},
    "olmoe": MOE,
}

# A value unlike the default for the keys where 3 would not be (type or meaning).
TEST_VALUES = {
    "rope.scaling.type": "longrope",
    "rope.scaling.original_context_length": 16,
    "rope.scaling.yarn_beta_fast": 16.0,
    "rope.scaling.yarn_beta_slow": 2.0,
    "rope.scaling.factor": 4.0,
    "rope.scale_linear": 4.0,
    "rope.freq_base": 5000.0,
    "rope.freq_base_swa": 5000.0,
    "rope.dimension_count": 8,
    "rope.dimension_sections": [2, 2, 4, 0],
    "attention.key_length": 8,
    "attention.causal": False,
    "use_parallel_residual": True,
    "attention.layer_norm_epsilon": 1e-3,
    "attention.layer_norm_rms_epsilon": 1e-3,
    "attn_logit_softcapping": 7.0,
    "final_logit_softcapping": 7.0,
    "rope.scaling.attn_factor": 1.5,
    "embedding_length": 32,
    "attention.head_count": 2,
    "attention.head_count_kv": 1,
    "block_count": 2,
    "vocab_size": 300,
    "feed_forward_length": 32,
    "context_length": 32,
}
# Keys that act only together with others: walked on top of these.
WITH = {
    k: {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}
    for k in (
        "rope.scaling.original_context_length",
        "rope.scaling.yarn_beta_fast",
        "rope.scaling.yarn_beta_slow",
    )
}
# The old name of rope.scaling.factor, which llama.cpp still reads (LLM_KV_ROPE_SCALE_LINEAR).
OLD_KEYS = ("{arch}.rope.scale_linear",)


def all_arch_keys() -> list[str]:
    """Every ``{arch}.*`` key name the gguf package knows, after the ``{arch}.`` prefix."""
    names = list(OLD_KEYS)
    for group in vars(gguf.Keys).values():
        if isinstance(group, type):
            names += [v for k, v in vars(group).items() if k.isupper() and isinstance(v, str)]
    out = {n.format(arch="A", dense="dense_2")[2:] for n in names if n.startswith("{arch}.")}
    return sorted(out)


def base_file(arch: str, path: Path, key: str | None = None, value=None, with_=None) -> Path:
    """A tensor-less GGUF with what the converter writes for `arch`, plus one key."""
    norm_key = ARCHITECTURES[arch].norm_eps_key
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (SIZES | {norm_key: 1e-5} | EXTRA.get(arch, {}) | (with_ or {})).items():
        if k != key:
            add_key(w, f"{arch}.{k}", v)
    if key is not None:
        add_key(w, f"{arch}.{key}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_key_is_mapped_or_refused(arch, tmp_path):
    """Each key, set alone to a non-default value: the config changes, or loading raises
    UnsupportedModelError naming the key; only the listed inert keys do neither."""
    outcome = {}
    for key in all_arch_keys():
        value = TEST_VALUES.get(key, 3)
        with_ = WITH.get(key) if "rope.scaling.type" in ARCHITECTURES[arch].keys else None
        base = open_checkpoint(base_file(arch, tmp_path / "base.gguf", with_=with_)).config
        path = base_file(arch, tmp_path / "k.gguf", key, value, with_)
        try:
            cfg = open_checkpoint(path).config
        except UnsupportedModelError as e:
            assert f"{arch}.{key}" in str(e) and "\n" not in str(e), str(e)
            outcome[key] = "refused"
            continue
        if key in INERT_KEYS:
            assert cfg == base, key
            outcome[key] = "inert"
        else:
            assert cfg != base, f"{arch}.{key} = {value!r} was ignored"
            outcome[key] = "mapped"
    mapped = sorted(k for k, v in outcome.items() if v == "mapped")
    print(f"\n{arch}: {len(outcome)} keys; mapped: {', '.join(mapped)}")
    assert len(outcome) > 100  # the whole table was walked


def test_neutral_values_and_other_namespaces(tmp_path):
    """A feature key at its "off" value loads; split files, adapters and other architectures'
    keys are refused by name; general/tokenizer/quantize keys are not the model's numbers."""
    from clearlm.loading.gguf_config import config_from_gguf

    def meta(**extra):
        m = {
            f"llama.{k}": v for k, v in (SIZES | {"attention.layer_norm_rms_epsilon": 1e-5}).items()
        }
        return {"general.architecture": "llama", **m, **extra}

    base = config_from_gguf(meta(), set(), "t.gguf")
    ok = {"llama.expert_count": 0, "llama.attention.causal": True, "split.count": 1}
    ok |= {"quantize.imatrix.file": "x.dat", "general.name": "x", "tokenizer.ggml.pre": "x"}
    assert config_from_gguf(meta(**ok), set(), "t.gguf") == base
    for key, value in (
        ("split.count", 2),
        ("adapter.type", "lora"),
        ("mistral.context_length", 64),
        ("llama.expert_count", 8),
        ("llama.attention.head_count", [4, 4, 8, 4]),  # per-layer counts that differ
    ):
        with pytest.raises(UnsupportedModelError, match=key.replace(".", r"\.")):
            config_from_gguf(meta(**{key: value}), set(), "t.gguf")
    uniform = meta(**{"llama.feed_forward_length": [128] * 4})
    assert config_from_gguf(uniform, set(), "t.gguf") == base


def test_rope_freqs_only_where_llama_cpp_reads_it(tmp_path):
    """rope_freqs.weight in a qwen2 file is refused by name (llama.cpp's qwen2 has none)."""
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "qwen2")
    for k, v in (SIZES | {"attention.layer_norm_rms_epsilon": 1e-5}).items():
        add_key(w, f"qwen2.{k}", v)
    w.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="rope_freqs.weight"):
        _ = open_checkpoint(path).config


REAL = [
    Path.home() / ".cache/clearlm/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    Path.home() / ".cache/clearlm/gemma-3-270m-q4_k_m.gguf",
]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_files_pass_the_key_rule(path, smollm2_path):
    """The real GGUFs the project runs hold only keys the rule accepts (metadata only)."""
    for p in (path, smollm2_path):
        if not p.exists():
            pytest.skip(f"{p} not pulled")
        cfg = open_checkpoint(p).config
        assert cfg.rope_scaling is None
