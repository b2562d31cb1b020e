"""``device=`` / ``--device``: resolving names, the one-line error for a device this machine
lacks, and (marked ``cuda``, skipped without a GPU) the tiny-model and SmolLM2 parity on CUDA
in float32 and a bfloat16 run there. bench/gpu_check.sh runs the ``cuda`` ones on a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hf_tiny import TINY, batch_tokens, greedy_reference, save_tiny
from parallel_worker import greedy
from tiny_gguf import write_tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

import clearlm
from clearlm.errors import DeviceError
from clearlm.loading.checkpoint import open_checkpoint
from clearlm.runtime.devices import resolve_device

HAS_CUDA = torch.cuda.is_available()
cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not HAS_CUDA, reason="needs a CUDA GPU (none here); run bench/gpu_check.sh on one"
    ),
]


def test_names_resolve():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if HAS_CUDA else "cpu")
    assert resolve_device(None) == resolve_device("auto")


@pytest.mark.parametrize(
    "name, message",
    [
        ("tpu", "unknown device 'tpu'; use one of auto, cpu, cuda, cuda:N, mps"),
        ("cuda:99", "device 'cuda:99' is not available"),
        ("meta", "device 'meta' is not supported"),
    ],
)
def test_bad_devices_are_one_typed_line(name, message):
    with pytest.raises(DeviceError) as e:
        resolve_device(name)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error of a machine without CUDA")
def test_cli_device_cuda_without_gpu(tmp_path):
    """``--device cuda`` on a CPU-only machine: one line naming it and what there is, exit 10,
    before any weight is read."""
    path = write_tiny_llama(tmp_path / "t.gguf")
    cmd = [sys.executable, "-m", "clearlm", "generate", "hi", "-m", str(path), "--device", "cuda"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 10
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert lines == ["error: device 'cuda' is not available: no CUDA here (have: cpu)"]


def test_load_on_cpu_keeps_cache_and_logits_there(tmp_path):
    path = write_tiny_llama(tmp_path / "t.gguf")
    model = clearlm.load(str(path), device="cpu", threads=1)
    assert model.transformer.device == torch.device("cpu")
    cache = model.transformer.new_cache(1, 8)
    assert cache.keys[0].device == torch.device("cpu")
    out = model.generate("hello", max_new_tokens=3, temperature=0.0)
    assert len(out.tokens) == 3


@cuda[0]
@cuda[1]
def test_tiny_parity_on_cuda(tmp_path):
    """A tiny Llama on the GPU: logits within 1e-4 of transformers on the CPU, greedy tokens
    with the cache (on the GPU) equal."""
    hf = save_tiny(LlamaForCausalLM, LlamaConfig(**TINY), tmp_path / "llama")
    model = open_checkpoint(tmp_path / "llama").load().model.to("cuda")
    tokens = batch_tokens(length=20)
    with torch.inference_mode():
        ref = hf(tokens).logits.float()
        got = model(tokens.cuda()).float().cpu()
    assert (got - ref).abs().max().item() <= 1e-4
    assert model.new_cache(1, 4).keys[0].device.type == "cuda"
    prompt = batch_tokens(seed=2, batch=1, length=8)[0].tolist()
    assert greedy(model, prompt, 16) == greedy_reference(hf, prompt, 16)


@cuda[0]
@cuda[1]
def test_smollm2_parity_on_cuda(smollm2_path, hf_smollm2_model):
    """SmolLM2 on the GPU in float32 against transformers on the CPU (1e-3, the CPU parity
    test's bound); then bfloat16 on the GPU agrees on the greedy next token of most positions."""
    m32 = clearlm.load(smollm2_path, device="cuda")
    ids = m32.encode("The quick brown fox jumps over the lazy dog. The capital of France is")
    with torch.inference_mode():
        ref = hf_smollm2_model(torch.tensor([ids])).logits[0].float()
        got = m32.transformer(torch.tensor([ids]))[0].float().cpu()
    diff = (got - ref).abs().max().item()
    print(f"\nSmolLM2 on CUDA, float32: max |Δlogit| = {diff:.2e}")
    assert diff <= 1e-3
    out = m32.generate(ids, max_new_tokens=16, temperature=0.0)
    cpu = clearlm.load(smollm2_path, device="cpu").generate(ids, max_new_tokens=16, temperature=0.0)
    assert out.tokens == cpu.tokens
    m16 = clearlm.load(smollm2_path, device="cuda", dtype="bfloat16")
    with torch.inference_mode():
        bf = m16.transformer(torch.tensor([ids]))[0].float().cpu()
    agree = (bf.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(f"bfloat16 on CUDA: top-1 agreement {agree:.2f}")
    assert agree >= 0.8
