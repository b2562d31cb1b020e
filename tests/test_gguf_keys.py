"""GGUF metadata that changes the numbers is read or refused, never ignored (issue 7, item 1).

- Parity: tiny transformers models written as GGUF files with the keys llama.cpp reads (linear
  and YaRN RoPE scaling, Llama 3's rope_freqs tensor, sliding windows, partial rotary, Gemma 2's
  soft-caps, Gemma 3's scaled global layers) give transformers' logits on the same weights.
- The walk: every ``{arch}.*`` key the ``gguf`` package defines (gguf.constants.Keys, the names
  llama.cpp's llama-arch.cpp uses), set to a non-default value in a tiny file of every
  architecture, either changes the loaded config or is refused with an error naming the key;
  only the keys loading/gguf_keys.py lists as inert may do neither.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGUFValueType
from hf_tiny import TINY, batch_tokens, llama_like_gguf_writer, save_tiny
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.loading.gguf_arch import ARCHITECTURES
from clearlm.loading.gguf_keys import INERT_KEYS
from clearlm.loading.hf import load_hf_model
from clearlm.loading.load import inspect_gguf, load_gguf_model
from clearlm.model.positions import rope_inv_freq

FOUR = dict(TINY, num_hidden_layers=4)
S, F = "sliding_attention", "full_attention"


def add_key(w: gguf.GGUFWriter, key: str, value) -> None:
    """One metadata key with the GGUF type llama.cpp's converter would give the value."""
    if isinstance(value, list):
        w.add_array(key, value)
    elif isinstance(value, bool):
        w.add_key_value(key, value, GGUFValueType.BOOL)
    elif isinstance(value, int):
        w.add_key_value(key, value, GGUFValueType.UINT32)
    elif isinstance(value, float):
        w.add_key_value(key, value, GGUFValueType.FLOAT32)
    else:
        w.add_key_value(key, value, GGUFValueType.STRING)


def write_gguf(model, arch: str, path: Path, keys: dict, tensors: dict | None = None) -> Path:
    """A transformers model as llama.cpp's converter writes it (tensor names, Q/K rows permuted
    for "llama", Gemma norms as 1 + w, the tied head left out), plus `keys` under ``{arch}.``
    and extra `tensors` (F32)."""
    c = model.config
    w, names = llama_like_gguf_writer(model, arch, path)
    for key, value in keys.items():
        add_key(w, f"{arch}.{key}", value)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(a.shape)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            a = a + np.float32(1.0)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), a)
    for name, a in (tensors or {}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_vs_reference(hf_model, path: Path) -> float:
    """max |ours(file) − transformers(original model)| over 2 × 20 tokens, float32."""
    tokens = batch_tokens(length=20)
    ours = load_gguf_model(path).model
    with torch.inference_mode():
        return (ours(tokens) - hf_model(tokens).logits).abs().max().item()


# ------------------------------------------------------------------------------------ parity


def test_issue_linear_rope_scaling_matches_transformers(tmp_path):
    """The issue's input: llama.rope.scaling.type = "linear", factor 4.0. Before, the file loaded
    with rope_scaling None and its logits were the unscaled model's."""
    config = LlamaConfig(**TINY, rope_scaling={"type": "linear", "factor": 4.0})
    scaled = save_tiny(LlamaForCausalLM, config, tmp_path / "hf")
    keys = {"rope.freq_base": 10000.0, "rope.scaling.type": "linear", "rope.scaling.factor": 4.0}
    path = write_gguf(scaled, "llama", tmp_path / "linear.gguf", keys)
    cfg = load_gguf_model(path).config
    assert (cfg.rope_scaling.kind, cfg.rope_scaling.factor) == ("linear", 4.0)
    diff = gguf_vs_reference(scaled, path)
    unscaled = save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), tmp_path / "plain")
    gap = gguf_vs_reference(unscaled, path)  # same weights (same seed), no scaling
    print(f"\nlinear ×4: max |Δlogit| = {diff:.2e} (unscaled model: {gap:.2f})")
    assert diff <= 1e-4 and gap > 0.1


def test_old_scale_linear_key_and_default_type(tmp_path):
    """llama.cpp reads the factor from rope.scale_linear when rope.scaling.factor is absent, and
    a missing rope.scaling.type means "linear"; "none" turns the factor off."""
    config = LlamaConfig(**TINY, rope_scaling={"type": "linear", "factor": 2.0})
    hf_model = save_tiny(LlamaForCausalLM, config, tmp_path / "hf")
    path = write_gguf(hf_model, "llama", tmp_path / "old.gguf", {"rope.scale_linear": 2.0})
    assert gguf_vs_reference(hf_model, path) <= 1e-4
    keys = {"rope.scaling.type": "none", "rope.scaling.factor": 2.0}
    path = write_gguf(hf_model, "llama", tmp_path / "none.gguf", keys)
    assert load_gguf_model(path).config.rope_scaling is None


def llama3_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors): Llama 3's scaling
    as one divisor per frequency, written as the rope_freqs.weight tensor."""
    base, factor = rope["rope_theta"], rope["factor"]
    low, high, orig = rope["low_freq_factor"], rope["high_freq_factor"], rope["orig"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def test_rope_freqs_tensor_matches_llama3_scaling(tmp_path):
    """Llama 3.1+ GGUFs carry their rope scaling as rope_freqs.weight (no metadata key):
    used as frequency divisors, it gives transformers' llama3 rope_type."""
    rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    rope |= dict(original_max_position_embeddings=64, rope_theta=10000.0)
    hf_model = save_tiny(LlamaForCausalLM, LlamaConfig(**TINY, rope_parameters=rope), tmp_path)
    factors = llama3_rope_freqs(rope | {"orig": 64}, 16)
    assert 1.0 < factors.max() and factors.min() == 1.0  # all three bands occur
    path = write_gguf(
        hf_model,
        "llama",
        tmp_path / "l3.gguf",
        {"rope.freq_base": 1e4},
        {"rope_freqs.weight": factors},
    )
    assert load_gguf_model(path).config.rope_scaling.kind == "factors"
    diff = gguf_vs_reference(hf_model, path)
    print(f"\nrope_freqs: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4
    wrong = write_gguf(
        hf_model, "llama", tmp_path / "w.gguf", {}, {"rope_freqs.weight": factors[:3]}
    )
    with pytest.raises(InvalidModelFileError, match="rope_freqs.weight"):
        inspect_gguf(wrong)
    both = write_gguf(
        hf_model,
        "llama",
        tmp_path / "b.gguf",
        {"rope.scaling.factor": 2.0},
        {"rope_freqs.weight": factors},
    )
    with pytest.raises(UnsupportedModelError, match="llama.rope.scaling.factor"):
        inspect_gguf(both)
    # any tensor the architecture's table does not name (here Phi-3's LongRoPE factors)
    extra = {"rope_factors_long.weight": factors}
    other = write_gguf(hf_model, "llama", tmp_path / "o.gguf", {"rope.freq_base": 1e4}, extra)
    with pytest.raises(UnsupportedModelError, match="rope_factors_long.weight"):
        load_gguf_model(other)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
YARN_BETAS = YARN | {"beta_fast": 4.0, "beta_slow": 0.5}  # ramp over pairs 1–4


@pytest.mark.parametrize("rope", [YARN, YARN_BETAS], ids=["yarn", "yarn-betas"])
def test_yarn_hf_folder_matches_transformers(rope, tmp_path):
    """YaRN from config.json (transformers' rope_type "yarn"): its ramp blends pairs 1–2 (default
    betas) or 1–3 (4, 0.5) of the 8 between kept and stretched frequencies."""
    config = Qwen2Config(**TINY, rope_parameters=rope | {"rope_theta": 10000.0})
    hf_model = save_tiny(Qwen2ForCausalLM, config, tmp_path)
    scaling = load_hf_model(tmp_path).config.rope_scaling
    assert scaling.kind == "yarn" and scaling.attention_factor == 0.1 * math.log(4.0) + 1
    changed = rope_inv_freq(16, 1e4, scaling, 40) != rope_inv_freq(16, 1e4, None, 40)
    assert 0 < int(changed.sum()) < 8  # the ramp keeps the fastest pairs, stretches the rest
    tokens = batch_tokens(length=40)
    with torch.inference_mode():
        diff = (load_hf_model(tmp_path).model(tokens) - hf_model(tokens).logits).abs().max().item()
    print(f"\n{rope}: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4


PARITY = {
    # Qwen 2.5/3 long-context GGUFs: YaRN with llama.cpp's keys.
    "qwen2-yarn": (
        Qwen2ForCausalLM,
        Qwen2Config(**TINY, rope_parameters=YARN_BETAS | {"rope_theta": 10000.0}),
        "qwen2",
        {
            "rope.freq_base": 10000.0,
            "rope.scaling.type": "yarn",
            "rope.scaling.factor": 4.0,
            "rope.scaling.original_context_length": 128,
            "rope.scaling.yarn_beta_fast": 4.0,
            "rope.scaling.yarn_beta_slow": 0.5,
        },
    ),
    # llama.cpp writes Mistral as "llama"; a window in the file means Mistral's.
    "llama-window": (
        MistralForCausalLM,
        MistralConfig(**TINY, sliding_window=5),
        "llama",
        {"rope.freq_base": 10000.0, "attention.sliding_window": 5},
    ),
    "phi3-partial-window": (
        Phi3ForCausalLM,
        Phi3Config(
            **TINY,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            sliding_window=5,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            },
        ),
        "phi3",
        {"rope.freq_base": 1e4, "rope.dimension_count": 8, "attention.sliding_window": 5},
    ),
    "gemma2-softcaps": (
        Gemma2ForCausalLM,
        Gemma2Config(
            **FOUR,
            head_dim=16,
            query_pre_attn_scalar=16,  # = head_dim: llama.cpp's scale below 27B
            attn_logit_softcapping=2.0,
            final_logit_softcapping=1.5,
            sliding_window=4,
        ),
        "gemma2",
        {
            "attention.key_length": 16,
            "attention.value_length": 16,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 1.5,
            "attention.sliding_window": 4,
        },
    ),
    "gemma3-linear-global": (
        Gemma3ForCausalLM,
        Gemma3TextConfig(
            **FOUR,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=4,
            layer_types=[S, F, S, S],
            rope_parameters={
                F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                S: {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
        "gemma3",
        {
            "attention.key_length": 16,
            "attention.value_length": 16,
            "rope.freq_base": 1e5,
            "rope.freq_base_swa": 1e4,
            "rope.scaling.type": "linear",
            "rope.scaling.factor": 2.0,
            "attention.sliding_window": 4,
            "attention.sliding_window_pattern": [True, False, True, True],
        },
    ),
}


@pytest.mark.parametrize("case", list(PARITY))
def test_mapped_keys_match_transformers(case, tmp_path):
    """Each mapped key with a transformers counterpart, 20 tokens (past the 4–5 token windows)."""
    model_cls, config, arch, keys = PARITY[case]
    hf_model = save_tiny(model_cls, config, tmp_path / "hf")
    path = write_gguf(hf_model, arch, tmp_path / f"{case}.gguf", keys)
    diff = gguf_vs_reference(hf_model, path)
    print(f"\n{case}: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4


# ------------------------------------------------------------------------------------ the walk

SIZES = {
    "block_count": 4,
    "context_length": 64,
    "embedding_length": 64,
    "feed_forward_length": 128,
    "attention.head_count": 4,
    "attention.head_count_kv": 2,
    "vocab_size": 320,
}
EXTRA = {"gemma2": {"attention.sliding_window": 4}, "gemma3": {"attention.sliding_window": 4}}

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
        base, _, _ = inspect_gguf(base_file(arch, tmp_path / "base.gguf", with_=with_))
        path = base_file(arch, tmp_path / "k.gguf", key, value, with_)
        try:
            cfg, _, _ = inspect_gguf(path)
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
    from clearlm.loading.gguf_arch import config_from_gguf

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
        inspect_gguf(path)


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
        cfg, _, _ = inspect_gguf(p)
        assert cfg.rope_scaling is None
