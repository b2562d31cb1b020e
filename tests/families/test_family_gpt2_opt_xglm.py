"""GPT-2 (learned positions, Conv1D fused QKV, tied head), OPT (offset-2 learned positions, ReLU,
pre-norm and post-norm, project_in/out) and XGLM (fairseq sinusoids, √D embedding scale) against
tiny random transformers models; GPT-2 also through GGUF files written the way llama.cpp does."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from hf_tiny import (
    VOCAB,
    batch_tokens,
    build_case,
    check_greedy,
    check_logits,
    greedy_reference,
    save_tiny,
)
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    OPTConfig,
    OPTForCausalLM,
    XGLMConfig,
    XGLMForCausalLM,
)

from clearlm.generation.loop import decode_step, new_cache, prefill
from clearlm.loading.checkpoint import load_gguf_model
from clearlm.loading.hf import load_hf_model

IDS = dict(bos_token_id=0, eos_token_id=2, pad_token_id=1)  # inside the tiny vocabulary
GPT2_TINY = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, **IDS)
OPT_TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    ffn_dim=128,
    max_position_embeddings=128,
    **IDS,
)
XGLM_TINY = dict(
    vocab_size=VOCAB,
    d_model=64,
    num_layers=2,
    attention_heads=4,
    ffn_dim=128,
    max_position_embeddings=128,
    **IDS,
)

CASES = {
    "gpt2": (GPT2LMHeadModel, GPT2Config(**GPT2_TINY)),
    "gpt2-untied": (GPT2LMHeadModel, GPT2Config(**GPT2_TINY, tie_word_embeddings=False)),
    "opt-pre-norm": (OPTForCausalLM, OPTConfig(**OPT_TINY, do_layer_norm_before=True)),
    "opt-post-norm": (OPTForCausalLM, OPTConfig(**OPT_TINY, do_layer_norm_before=False)),
    # OPT-350m's shape: post-norm, tokens embedded in 32 and projected to/from 64
    "opt-350m-like": (
        OPTForCausalLM,
        OPTConfig(**OPT_TINY, do_layer_norm_before=False, word_embed_proj_dim=32),
    ),
    "opt-no-affine": (OPTForCausalLM, OPTConfig(**OPT_TINY, layer_norm_elementwise_affine=False)),
    "xglm": (XGLMForCausalLM, XGLMConfig(**XGLM_TINY)),
    "xglm-unscaled": (XGLMForCausalLM, XGLMConfig(**XGLM_TINY, scale_embedding=False)),
}


@pytest.fixture(scope="module", params=list(CASES))
def tiny(request, tmp_path_factory):
    return build_case(CASES, request.param, tmp_path_factory)


def test_logits_match_transformers(tiny):
    check_logits(tiny, 1e-4)


def test_greedy_with_cache_matches_transformers(tiny):
    check_greedy(tiny)


def test_config_mapping(tiny):
    name, hf_model, folder = tiny
    cfg = load_hf_model(folder).config
    assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == (64, 2, 4, 4)
    assert cfg.norm == "layer" and cfg.ffn == "mlp"
    if name.startswith("gpt2"):
        assert (cfg.position, cfg.position_offset, cfg.activation) == ("learned", 0, "gelu_tanh")
        assert cfg.d_ff == 256 and cfg.tie_word_embeddings == (name == "gpt2")
    if name.startswith("opt"):
        assert (cfg.position, cfg.position_offset, cfg.activation) == ("learned", 2, "relu")
        post = name in ("opt-post-norm", "opt-350m-like")
        assert cfg.block == ("post" if post else "pre") and cfg.final_norm == (not post)
        assert cfg.embed_dim == (32 if name == "opt-350m-like" else 64)
    if name.startswith("xglm"):
        assert (cfg.position, cfg.position_offset, cfg.activation) == ("sinusoidal", 2, "gelu")
        assert cfg.embed_scale == (8.0 if name == "xglm" else 1.0)


def test_tied_head_shares_the_embedding(tiny):
    name, _, folder = tiny
    model = load_hf_model(folder).model
    tied = model.config.tie_word_embeddings
    assert (model.lm_head.weight is model.embed_tokens.weight) == tied
    assert tied == (name != "gpt2-untied")


# --- GPT-2 through GGUF ------------------------------------------------------------------------

CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def write_gpt2_gguf(hf_model: GPT2LMHeadModel, path: Path, qtype: GGMLQuantizationType) -> Path:
    """Write a GPT-2 GGUF as llama.cpp's convert_hf_to_gguf.py (GPT2Model) does: ``gpt2.*``
    metadata, Conv1D weights transposed to (out, in), the fused attn_qkv kept, the tied head
    left out. 2-D weights are stored as `qtype`, except position_embd, which llama.cpp keeps F32
    (as it does norms and biases)."""
    cfg = hf_model.config
    w = GGUFWriter(str(path), "gpt2")
    w.add_block_count(cfg.n_layer)
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(4 * cfg.n_embd)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<{i}>" for i in range(cfg.vocab_size)])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, cfg.n_layer)
    for hf_name, t in hf_model.state_dict().items():
        if hf_name == "lm_head.weight":
            continue  # tied: llama.cpp reuses token_embd
        a = t.detach().float().numpy()
        if hf_name.endswith(CONV1D):
            a = a.T  # Conv1D (in, out) → (out, in)
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        a = np.ascontiguousarray(a)
        if a.ndim == 2 and name != "position_embd.weight" and qtype != GGMLQuantizationType.F32:
            w.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gpt2_hf(tmp_path_factory):
    """n_positions 1024 (GPT-2's own): transformers' GGUF reader maps gpt2.context_length to
    n_ctx, not n_positions, so it always builds a 1024-row position table."""
    folder = tmp_path_factory.mktemp("gpt2-for-gguf")
    return save_tiny(GPT2LMHeadModel, GPT2Config(**{**GPT2_TINY, "n_positions": 1024}), folder)


def greedy_model(model, prompt: list[int], n: int) -> list[int]:
    cache = new_cache(model, 1, len(prompt) + n)
    logits = prefill(model, torch.tensor([prompt]), cache)
    out = []
    for _ in range(n):
        out.append(int(logits[0].argmax()))
        logits = decode_step(model, torch.tensor([[out[-1]]]), cache)
    return out


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0])
def test_gpt2_gguf_matches_transformers(gpt2_hf, tmp_path, qtype):
    """F32: against the safetensors model. Q8_0: against transformers reading the same GGUF
    (it dequantizes to float32 and transposes back to Conv1D), so both see the same weights."""
    path = write_gpt2_gguf(gpt2_hf, tmp_path / f"tiny-gpt2-{qtype.name}.gguf", qtype)
    loaded = load_gguf_model(path)
    assert loaded.config.family == "GPT-2" and loaded.config.tie_word_embeddings
    types = loaded.tensor_types
    assert types["blk.0.attn_qkv.weight"] == qtype.name
    assert types["position_embd.weight"] == "F32"
    if qtype == GGMLQuantizationType.F32:
        reference = gpt2_hf
    else:
        reference = AutoModelForCausalLM.from_pretrained(
            tmp_path, gguf_file=path.name, dtype=torch.float32
        ).eval()
    tokens = batch_tokens(length=20)
    with torch.inference_mode():
        ref = reference(tokens).logits.float()
        got = loaded.model(tokens).float()
    diff = (got - ref).abs().max().item()
    print(f"\ngpt2 GGUF {qtype.name}: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-4
    if qtype != GGMLQuantizationType.F32:  # quantization did change the weights
        with torch.inference_mode():
            assert (gpt2_hf(tokens).logits - ref).abs().max().item() > 1e-4
    prompt = batch_tokens(seed=2, batch=1, length=8)[0].tolist()
    assert greedy_model(loaded.model, prompt, 16) == greedy_reference(reference, prompt, 16)
