"""Gemma, Gemma 2, Gemma 3 and Phi-3 against tiny random transformers models.

Two routes per family:
- Hugging Face folders (safetensors): logits over a batch, greedy decoding with the KV cache past
  the sliding window, and every decode step's logits against transformers' full forward.
- The same weights written as GGUF the way llama.cpp's converter writes them (names from
  ``gguf.get_tensor_name_map``, Gemma norms stored as 1 + w, its metadata keys), in F32 and Q8_0.
  F32 is compared with the original transformers model; Q8_0 with transformers loading the same
  file (``gguf_file=``), or, for architecture "gemma" which transformers' GGUF loader does not
  read, with the original model holding the file's dequantized weights (gguf.quants).

The GGUF models use the conventions llama.cpp and transformers' GGUF loader both assume, since
the file does not store them: query_pre_attn_scalar = head_dim (256), Gemma 2's soft-caps
50/30 (transformers' GGUF loader ignores the keys), Gemma 3's fixed 5:1 layer pattern (6 layers),
full rotary and no sliding window for Phi-3 (llama.cpp turns Phi SWA off).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from hf_tiny import (
    TINY,
    batch_tokens,
    build_case,
    check_greedy,
    check_logits,
    dequantized_reference,
    llama_like_gguf_writer,
    save_tiny,
)
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GemmaConfig,
    GemmaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)
from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

from clearlm.errors import UnsupportedModelError
from clearlm.families.base import HFConfig
from clearlm.families.gemma import gemma3_config
from clearlm.generation.loop import decode_step, new_cache, prefill
from clearlm.loading.checkpoint import load_gguf_model
from clearlm.loading.gguf_config import config_from_gguf
from clearlm.loading.hf import load_hf_model

TOL = 1e-4
FOUR = dict(TINY, num_hidden_layers=4)
PHI_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)  # Phi3Config's 32000 > VOCAB
S, F = "sliding_attention", "full_attention"
PARTIAL_ROPE = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}

CASES = {
    "gemma": (GemmaForCausalLM, GemmaConfig(**TINY, head_dim=16)),
    # untied, so greedy decoding is not dominated by copying the last token
    "gemma2-softcap": (
        Gemma2ForCausalLM,
        Gemma2Config(
            **FOUR,
            head_dim=16,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=1.5,
            sliding_window=4,
            tie_word_embeddings=False,
        ),
    ),
    "gemma3": (
        Gemma3ForCausalLM,
        Gemma3TextConfig(
            **FOUR,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=4,
            layer_types=[S, F, S, S],
            rope_parameters={
                F: {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5},
                S: {"rope_type": "default", "rope_theta": 1e4},
            },
            final_logit_softcapping=3.0,
        ),
    ),
    "phi3": (Phi3ForCausalLM, Phi3Config(**TINY, **PHI_IDS)),
    "phi3-partial-window": (
        Phi3ForCausalLM,
        Phi3Config(
            **TINY,
            **PHI_IDS,
            sliding_window=5,
            rope_parameters=PARTIAL_ROPE,
        ),
    ),
}


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tmp_path_factory):
    return build_case(CASES, request.param, tmp_path_factory)


def test_logits_match_transformers(tiny):
    check_logits(tiny, TOL)


def test_greedy_with_cache_matches_transformers(tiny):
    """24 new tokens after an 8-token prompt: well past the 4- and 5-token windows."""
    check_greedy(tiny)


def test_every_decode_step_matches_full_forward(tiny):
    """Prefill 3 tokens, then decode 17 one at a time: each step's logits equal transformers'
    full forward at that position (the windowed mask with a cache offset)."""
    name, hf_model, folder = tiny
    seq = batch_tokens(seed=3, batch=1, length=20)  # (1, 20)
    ours = load_hf_model(folder).model
    cache = new_cache(ours, 1, 20)
    steps = [prefill(ours, seq[:, :3], cache)]
    steps += [decode_step(ours, seq[:, t : t + 1], cache) for t in range(3, 20)]
    with torch.inference_mode():
        ref = hf_model(seq).logits[0, 2:].float()  # (18, V)
    diff = (torch.cat(steps).float() - ref).abs().max().item()
    print(f"\n{name}: decode steps max |Δlogit| = {diff:.2e}")
    assert diff <= TOL


def test_bfloat16_stays_within_rounding(tiny):
    """bfloat16 weights and activations: as far from the float32 reference as transformers' own
    bfloat16 run is (measured: both 0.02–0.05 on these models), not bit-identical to it."""
    name, hf_model, folder = tiny
    tokens = batch_tokens(length=20)
    ours = load_hf_model(folder, dtype=torch.bfloat16).model
    with torch.inference_mode():
        got = ours(tokens)
        ref = hf_model(tokens).logits.float()
    assert got.dtype == torch.bfloat16
    diff = (got.float() - ref).abs().max().item()
    print(f"\n{name}: bfloat16 vs float32 reference max |Δlogit| = {diff:.2e}")
    assert diff <= 0.1


def test_config_mapping(tiny):
    name, _, folder = tiny
    cfg = load_hf_model(folder).config
    if name.startswith("gemma"):
        assert cfg.embed_scale == 64**0.5 and cfg.norm_offset == 1.0
        assert cfg.activation == "gelu_tanh" and cfg.ffn == "gated"
    if name == "gemma":
        assert cfg.block == "pre" and cfg.tie_word_embeddings and cfg.attn_scale is None
    if name == "gemma2-softcap":
        assert cfg.block == "sandwich" and cfg.attn_scale == 24**-0.5
        assert (cfg.attn_softcap, cfg.final_logit_softcap) == (2.0, 1.5)
        assert cfg.layer_types == ("sliding", "full") * 2 and cfg.sliding_window == 4
    if name == "gemma3":
        assert cfg.qk_norm and cfg.attn_softcap is None and cfg.final_logit_softcap == 3.0
        assert cfg.layer_types == ("sliding", "full", "sliding", "sliding")
        assert (cfg.rope_theta, cfg.rope_local_theta) == (1e5, 1e4)
        assert cfg.rope_scaling.kind == "linear" and cfg.rope_scaling.factor == 2.0
    if name == "phi3-partial-window":
        assert cfg.rope_dim == 8 and cfg.head_dim == 16
        assert cfg.sliding_window == 5 and set(cfg.layer_types) == {"sliding"}


# ---------------------------------------------------------------- GGUF, as llama.cpp writes it

GGUF_CASES = {
    "gemma": (GemmaForCausalLM, GemmaConfig(**TINY, head_dim=16)),
    "gemma2": (
        Gemma2ForCausalLM,
        Gemma2Config(**FOUR, head_dim=256, sliding_window=4),  # llama.cpp: always tied
    ),
    "gemma3": (
        Gemma3ForCausalLM,
        Gemma3TextConfig(**dict(TINY, num_hidden_layers=6), head_dim=256, sliding_window=4),
    ),
    "phi3": (Phi3ForCausalLM, Phi3Config(**TINY, **PHI_IDS)),
}
Q8 = GGMLQuantizationType.Q8_0


def write_gguf(model, arch: str, path: Path, qtype: GGMLQuantizationType) -> dict[str, str]:
    """Write a transformers model as llama.cpp's convert_hf_to_gguf.py would (GemmaModel,
    Gemma2Model, Gemma3Model, Phi3MiniModel): its metadata keys, its tensor names, Gemma norms
    as 1 + w, the tied head left out; matrices in `qtype`, vectors in F32.

    Returns:
        GGUF tensor name → transformers parameter name.
    """
    c = model.config
    w, names = llama_like_gguf_writer(model, arch, path)
    w.add_bos_token_id(c.bos_token_id)  # gguf.SpecialVocab's keys (no vocabulary needed here)
    w.add_eos_token_id(c.eos_token_id)
    w.add_pad_token_id(c.pad_token_id)
    if arch.startswith("gemma"):
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
        w.add_sliding_window(c.sliding_window)
    if arch == "gemma3":
        w.add_rope_freq_base(c.rope_parameters[F]["rope_theta"])
        w.add_rope_freq_base_swa(c.rope_parameters[S]["rope_theta"])
        w.add_sliding_window(c.sliding_window)
    if arch == "phi3":
        rope = c.rope_parameters
        rot = int(c.hidden_size * rope["partial_rotary_factor"]) // c.num_attention_heads
        w.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
        w.add_rope_dimension_count(rot)
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_sliding_window(c.sliding_window or 0)
    back = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        a = t.float().numpy()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            a = a + np.float32(1.0)  # llama.cpp: data_torch + 1
        if a.ndim == 2 and qtype != GGMLQuantizationType.F32:
            w.add_tensor(gguf_name, quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gguf_name, a)
        back[gguf_name] = name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return back


@pytest.fixture(scope="module", params=list(GGUF_CASES))
def tiny_gguf(request, tmp_path_factory):
    arch = request.param
    model_cls, config = GGUF_CASES[arch]
    folder = tmp_path_factory.mktemp(f"{arch}-hf")
    hf_model = save_tiny(model_cls, config, folder)
    files = tmp_path_factory.mktemp(f"{arch}-gguf")
    back = write_gguf(hf_model, arch, files / "f32.gguf", GGMLQuantizationType.F32)
    write_gguf(hf_model, arch, files / "q8_0.gguf", Q8)
    return arch, hf_model, folder, files, back


def _diff(ours, ref, tokens: torch.Tensor) -> float:
    with torch.inference_mode():
        return (ours(tokens).float() - ref(tokens).logits.float()).abs().max().item()


def test_gguf_config_matches_hf_config(tiny_gguf):
    """What the GGUF metadata gives equals what config.json gives (the attention scale as
    the effective number: the file has no query_pre_attn_scalar; ε as float32)."""
    arch, _, folder, files, _ = tiny_gguf
    hf = load_hf_model(folder).config
    ours = load_gguf_model(files / "f32.gguf").config
    scale = (ours.attn_scale or ours.head_dim**-0.5, hf.attn_scale or hf.head_dim**-0.5)
    assert scale[0] == pytest.approx(scale[1])
    assert ours.norm_eps == pytest.approx(hf.norm_eps, rel=1e-6)
    same = dict(architecture=hf.architecture, attn_scale=hf.attn_scale, norm_eps=hf.norm_eps)
    assert replace(ours, **same) == hf


def test_gguf_f32_matches_transformers(tiny_gguf):
    arch, hf_model, _, files, _ = tiny_gguf
    ours = load_gguf_model(files / "f32.gguf").model
    diff = _diff(ours, hf_model, batch_tokens(length=20))
    print(f"\n{arch} GGUF F32: max |Δlogit| = {diff:.2e}")
    assert diff <= TOL


def test_gguf_q8_0_matches_transformers_on_same_file(tiny_gguf):
    arch, hf_model, _, files, back = tiny_gguf
    path = files / "q8_0.gguf"
    if arch in GGUF_SUPPORTED_ARCHITECTURES:
        ref = AutoModelForCausalLM.from_pretrained(files, gguf_file=path.name, dtype=torch.float32)
        how = "transformers gguf_file="
    else:
        ref = dequantized_reference(hf_model, arch, path, back)
        how = "dequantized into transformers"
    ours = load_gguf_model(path).model
    tokens = batch_tokens(length=20)
    diff = _diff(ours, ref.eval(), tokens)
    print(f"\n{arch} GGUF Q8_0 vs {how}: max |Δlogit| = {diff:.2e}")
    print(f"{arch} GGUF Q8_0 vs F32 original: {_diff(ours, hf_model, tokens):.2e} (quantization)")
    assert diff <= TOL


# ---------------------------------------------------------------- configs without weights


def test_gemma3_legacy_config_keys():
    """transformers 4.5x files: rope_theta / rope_local_base_freq / rope_scaling (global layers
    only) / sliding_window_pattern instead of rope_parameters and layer_types."""
    keys = dict(
        model_type="gemma3_text",
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        query_pre_attn_scalar=16,
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window=512,
        sliding_window_pattern=6,
    )
    cfg = gemma3_config(HFConfig(keys, "config.json"))
    assert cfg["layer_types"] == (("sliding",) * 5 + ("full",)) * 2
    assert (cfg["rope_theta"], cfg["rope_local_theta"]) == (1e6, 1e4)
    assert cfg["rope_scaling"].kind == "linear" and cfg["rope_scaling"].factor == 8.0
    assert cfg["tie_word_embeddings"] and cfg["final_logit_softcap"] is None


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "phi3", "rope_scaling": {"type": "longrope", "short_factor": [1.0]}},
        {"model_type": "phi3", "rope_scaling": {"type": "su"}},
        {"model_type": "phi3", "rope_parameters": {"rope_type": "longrope", "factor": 32.0}},
        {"model_type": "gemma3", "text_config": {"hidden_size": 640}},
        {"model_type": "gemma3_text", "use_bidirectional_attention": True},
    ],
)
def test_unsupported_configs_are_refused(tmp_path, config):
    import json

    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").touch()  # never read: the config is refused first
    with pytest.raises(UnsupportedModelError) as e:
        load_hf_model(tmp_path)
    print(f"\n{e.value}")


def _gemma3_metadata(**extra) -> dict:
    a = "gemma3"
    m = {
        "general.architecture": a,
        f"{a}.embedding_length": 64,
        f"{a}.attention.head_count": 4,
        f"{a}.attention.head_count_kv": 1,
        f"{a}.attention.key_length": 16,
        f"{a}.block_count": 12,
        f"{a}.feed_forward_length": 128,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.context_length": 128,
        f"{a}.vocab_size": 320,
        f"{a}.rope.freq_base": 1e6,
        f"{a}.attention.sliding_window": 512,
    }
    return m | {f"{a}.{k}": v for k, v in extra.items()}


def test_gemma3_gguf_metadata_variants():
    """llama.cpp's defaults (period 6, local base 10 000) and the keys newer converters write:
    a period or per-layer bools, rope.freq_base_swa, a linear scaling of global layers."""
    cfg = config_from_gguf(_gemma3_metadata(), set(), "t.gguf")
    assert cfg.layer_types == (("sliding",) * 5 + ("full",)) * 2 and cfg.rope_local_theta == 1e4
    assert cfg.rope_scaling is None and cfg.attn_scale is None and cfg.tie_word_embeddings
    m = _gemma3_metadata(
        **{"attention.sliding_window_pattern": 3, "rope.freq_base_swa": 5e4},
        **{"rope.scaling.type": "linear", "rope.scaling.factor": 8.0},
    )
    cfg = config_from_gguf(m, set(), "t.gguf")
    assert cfg.layer_types == ("sliding", "sliding", "full") * 4 and cfg.rope_local_theta == 5e4
    assert cfg.rope_scaling.kind == "linear" and cfg.rope_scaling.factor == 8.0
    bools = [i % 2 == 0 for i in range(12)]
    m = _gemma3_metadata(**{"attention.sliding_window_pattern": bools})
    cfg = config_from_gguf(m, set(), "t.gguf")
    assert cfg.layer_types == ("sliding", "full") * 6
    cfg = config_from_gguf(_gemma3_metadata(**{"attention.sliding_window": 0}), set(), "t.gguf")
    assert cfg.sliding_window is None and set(cfg.layer_types) == {"full"}
    # the 27B model (62 layers): llama.cpp scales by 1/√(D/H), its query_pre_attn_scalar
    cfg = config_from_gguf(_gemma3_metadata(block_count=62), set(), "t.gguf")
    assert cfg.attn_scale == 16**-0.5


def test_phi3_gguf_longrope_is_refused():
    m = {
        k.replace("gemma3", "phi3"): v
        for k, v in _gemma3_metadata(**{"rope.scaling.attn_factor": 1.19}).items()
    }
    with pytest.raises(UnsupportedModelError, match="longrope"):
        config_from_gguf(m | {"general.architecture": "phi3"}, set(), "t.gguf")
