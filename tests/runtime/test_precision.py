"""matmul_precision (clearlm.runtime.precision): "highest" is today's exact path bit for bit,
"medium"
stays within measured bounds of it, decode-sized forwards are untouched, torch's global setting
is restored after every forward, and bad values are refused with one line.

Reference: the same file loaded with the default precision (float32, "highest"; itself checked
against transformers in test_model_parity.py). Each bound is about twice the value measured
here (in the comment); "medium" rounds matmul inputs to bfloat16 (8 bits of mantissa), so its
distance is orders of magnitude above the compact mode's summation-order noise
(test_quant_distance.py) and below llama.cpp's own (up to 0.76 in logits on SmolLM2).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import SamplingParamsError
from clearlm.inspect.distance import cache_for, window_distances
from clearlm.model.kv_cache import KVCache
from clearlm.quant.linear import SMALL_M
from clearlm.runtime.precision import (
    float32_matmul_precision,
    parse_matmul_precision,
    set_matmul_precision,
)


def _medium_rounds_to_bf16() -> bool:
    """Does "medium" round a prefill-sized product's inputs to bfloat16 here? Rounding to 8
    mantissa bits moves such a product by ~1e-3 of its size. Without bfloat16 units oneDNN
    computes it in float32 (no change), and a CPU with avx512_bf16 but no AMX (seen 2026-12-02)
    changed it by ~1e-6 of its size, and not at all at K = 64 (the tiny model's d_model): there
    "medium" is float32 in all but name and the "it really differs" checks do not apply."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 256, generator=g), torch.randn(128, 256, generator=g)  # (T, d), (out, d)
    with float32_matmul_precision("medium"):
        medium = torch.nn.functional.linear(x, w)
    ref = torch.nn.functional.linear(x, w)
    return ((medium - ref).abs().mean() / ref.abs().mean()).item() > 1e-4


BF16 = _medium_rounds_to_bf16()  # the product itself says; the CPU flags alone misled once


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama with Q8_0 matrices (compact layers) and F32 norms/embedding."""
    return write_tiny_llama(tmp_path_factory.mktemp("prec") / "tiny.gguf", matrix_type=Q.Q8_0,
                            seed=5)  # fmt: skip


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    """F32 matrices: float32 layers only, so a CLI run needs no compiled kernel."""
    return write_tiny_llama(tmp_path_factory.mktemp("prec32") / "tiny.gguf", seed=5)


def _prefill_and_decode(net: torch.nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits of a prefill of ids[:, :-3] then three one-token steps through a cache."""
    cache = cache_for(net, ids.shape[1])
    with torch.inference_mode():
        out = [net(ids[:, :-3], cache=cache)]
        out += [net(ids[:, t : t + 1], cache=cache) for t in range(ids.shape[1] - 3, ids.shape[1])]
    return out


# ---- "highest": today's path, bit for bit ----


@pytest.mark.parametrize("weights", ["compact", "float32"])
def test_highest_is_bit_identical_to_the_default(tiny, weights, alice_text):
    default = clearlm.load(tiny, weights=weights, threads=1)
    highest = clearlm.load(tiny, weights=weights, threads=1, matmul_precision="highest")
    assert not highest.transformer._forward_hooks and not highest.transformer._forward_pre_hooks
    ids = torch.tensor([default.encode(alice_text)[:40]])  # (1, 40)
    want = _prefill_and_decode(default.transformer, ids)
    for got, ref in zip(_prefill_and_decode(highest.transformer, ids), want, strict=True):
        assert torch.equal(got, ref)
    set_matmul_precision(highest.transformer, "medium")  # on, then off again: no trace left
    set_matmul_precision(highest.transformer, "highest")
    assert not highest.transformer._forward_hooks and not highest.transformer._forward_pre_hooks
    for got, ref in zip(_prefill_and_decode(highest.transformer, ids), want, strict=True):
        assert torch.equal(got, ref)


# ---- "medium": within bounds on prompts, untouched on decode ----

# measured 2026-12-01 (1 thread, AMX-BF16 CPU), tiny Q8_0 llama, alice.txt in windows of 64
# (2,240 positions), prefill path, compact and float32 weights alike: max |Δlogit| 0.049,
# mean KL 2.1e-5, max KL 9.8e-5 nats, top-1 99.4%.
TINY_BOUND = {"max_abs_logit": 0.1, "mean_kl": 4e-5, "max_kl": 2e-4, "top1": 0.98}


@pytest.mark.parametrize("weights", ["compact", "float32"])
def test_tiny_medium_within_bounds(tiny, weights, alice_text):
    ref = clearlm.load(tiny, weights=weights)
    med = clearlm.load(tiny, weights=weights)
    set_matmul_precision(med.transformer, "medium")
    ids = ref.encode(alice_text)
    d = window_distances(ref.transformer, med.transformer, ids, 64, 64, chunks=(None,))[None]
    print(f"\n{weights} medium vs highest, prefill: {d}")
    assert d.n_positions >= 2000
    assert d.max_abs_logit <= TINY_BOUND["max_abs_logit"]
    assert d.mean_kl <= TINY_BOUND["mean_kl"] and d.max_kl <= TINY_BOUND["max_kl"]
    assert d.top1_agreement >= TINY_BOUND["top1"]
    if BF16:  # it really computed in bfloat16 (else the bound would test nothing)
        assert d.max_abs_logit > 1e-3


@pytest.mark.parametrize("weights", ["compact", "float32"])
def test_medium_leaves_decode_sized_forwards_alone(tiny, weights, alice_text):
    """Forwards of <= 4 rows (decode: the kernel, or float32 GEMV) give the same bits as
    "highest" when fed the same cache; the prompt's forward differs (bfloat16 products)."""
    ref = clearlm.load(tiny, weights=weights, threads=1)
    med = clearlm.load(tiny, weights=weights, threads=1, matmul_precision="medium")
    assert med.transformer.matmul_precision == "medium"
    ids = torch.tensor([ref.encode(alice_text)[:40]])  # (1, 40)
    cache_r, cache_m = cache_for(ref.transformer, 40), cache_for(med.transformer, 40)
    with torch.inference_mode():
        if BF16:
            assert not torch.equal(ref.transformer(ids[:, :36]), med.transformer(ids[:, :36]))
        for cache in (cache_r, cache_m):  # the same cache contents for both
            ref.transformer(ids[:, :36], cache=cache)
        for t in range(36, 40):
            step = ids[:, t : t + 1]  # (1, 1)
            assert torch.equal(ref.transformer(step, cache=cache_r),
                               med.transformer(step, cache=cache_m))  # fmt: skip


@pytest.mark.parametrize("weights", ["compact", "float32"])
def test_medium_leaves_batched_decode_of_many_sequences_alone(tiny, weights, alice_text):
    """Decode of B = 20 > SMALL_M sequences (T = 1, 20 rows: the compact layers' band path, not
    the kernel) gives the same bits as "highest" from the same cache (the scope keys on T, not
    B*T; docs/speed.md, "Prefill in bfloat16": decode is untouched); a prefill of the same batch
    (T = 20) still runs in bfloat16 and differs."""
    ref = clearlm.load(tiny, weights=weights, threads=1)
    med = clearlm.load(tiny, weights=weights, threads=1, matmul_precision="medium")
    c = ref.transformer.config
    flat = ref.encode(alice_text)
    B, T = 20, 20  # 20 sequences of 20 prompt tokens, then 3 decode steps each
    ids = torch.tensor([flat[i * 5 : i * 5 + T + 3] for i in range(B)])  # (B, T + 3)
    cache_r, cache_m = (KVCache(c.n_layers, B, c.n_kv_heads, c.head_dim, T + 3) for _ in "rm")
    with torch.inference_mode():
        if BF16:  # the batch's prefill: medium, so not the float32 bits
            assert not torch.equal(ref.transformer(ids[:, :T]), med.transformer(ids[:, :T]))
        for cache in (cache_r, cache_m):  # the same cache contents for both
            ref.transformer(ids[:, :T], cache=cache)
        for t in range(T, T + 3):
            step = ids[:, t : t + 1]  # (B, 1)
            want = ref.transformer(step, cache=cache_r)  # (B, 1, V)
            got = med.transformer(step, cache=cache_m)
            assert got.shape == (B, 1, c.vocab_size) and torch.equal(got, want)


# ---- the global torch setting ----


def test_global_setting_is_scoped_and_restored(tiny, alice_text):
    m = clearlm.load(tiny, threads=1, matmul_precision="medium")
    seen: list[str] = []
    layer = m.transformer.layers[0]
    layer.register_forward_pre_hook(lambda mod, args: seen.append(
        torch.get_float32_matmul_precision()))  # fmt: skip
    head: list[str] = []  # the output projection: medium only when it gets T > SMALL_M
    m.transformer.lm_head.register_forward_pre_hook(lambda mod, args: head.append(
        torch.get_float32_matmul_precision()))  # fmt: skip
    ids = torch.tensor([m.encode(alice_text)[:20]])  # (1, 20)
    with float32_matmul_precision("high"):  # the caller's own setting, not the default
        with torch.inference_mode():
            m.transformer(ids)  # 20 rows: medium inside
            m.transformer(ids, last_only=True)  # medium inside, but the head gets 1 row
            m.transformer(ids[:, :SMALL_M])  # T = SMALL_M: untouched
            m.transformer(ids[:, :1].expand(SMALL_M + 1, 1))  # decode of B = SMALL_M + 1: untouched
            m.transformer(ids[:, :SMALL_M].expand(3, SMALL_M))  # B*T = 48 rows, T = 16: untouched
            m.transformer(ids[:, : SMALL_M + 1].expand(2, SMALL_M + 1))  # T = SMALL_M + 1: medium
            assert torch.get_float32_matmul_precision() == "high"
            with pytest.raises(IndexError):  # fails inside the scope, at the embedding
                m.transformer(torch.full((1, 8), 10**6))
            assert torch.get_float32_matmul_precision() == "high"
    # the failing forward never reached layer 0
    assert seen == ["medium", "medium", "high", "high", "high", "medium"]
    assert head == ["medium", "high", "high", "high", "high", "medium"]
    assert torch.get_float32_matmul_precision() == "highest"


# ---- bad values ----


@pytest.mark.parametrize("bad", ["high", "bf16", "", 3])
def test_bad_precision_is_refused(tiny, bad):
    assert parse_matmul_precision(None) == "highest"  # None: the default
    with pytest.raises(SamplingParamsError, match="use highest or medium"):
        clearlm.load(tiny, matmul_precision=bad)
    with pytest.raises(SamplingParamsError, match="use highest or medium"):
        set_matmul_precision(torch.nn.Linear(2, 2), bad)


def test_cli_refuses_a_bad_precision_in_one_line(tiny_f32):
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "generate", "hi", "-m", str(tiny_f32), "-n", "2",
         "--matmul-precision", "low"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "highest, medium" in lines[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cli_medium_runs_and_says_so(tiny_f32, dtype):
    """The loading line says "medium matmuls" only where it applies (float32 compute); with a
    bfloat16 model it says the option has no effect (its products are bfloat16 already)."""
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "generate", "hello there", "-m", str(tiny_f32), "-n", "3",
         "--temperature", "0", "--threads", "1", "--matmul-precision", "medium", "--dtype", dtype],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    loading = [line for line in proc.stderr.splitlines() if "done in" in line]
    assert len(loading) == 1, proc.stderr
    if dtype == "float32":
        assert loading[0].endswith(" · medium matmuls")
    else:
        assert "matmuls" not in loading[0]
        assert loading[0].endswith(" · --matmul-precision medium has no effect in bfloat16")


# ---- SmolLM2-135M-Instruct (the default model) ----

# measured 2026-12-01 (bench/distance.py --matmul-precision medium, 1 thread, AMX-BF16 CPU):
# compact weights + medium against float32 + highest, alice.txt in 17 windows of 128 every 26
# (2,176 positions), prefill path: max |Δlogit| 0.52, mean KL 1.95e-4, max KL 8.1e-3 nats,
# top-1 99.03%; perplexity 22.6428 vs 22.6538 (0.05%). llama.cpp's logits differ from
# transformers' by up to 0.76 on this model.
SMOL_BOUND = {"max_abs_logit": 1.0, "mean_kl": 4e-4, "max_kl": 1.6e-2, "top1": 0.98, "ppl": 1e-3}


def test_smollm2_medium_distance_over_2000_positions(smollm2, smollm2_path, alice_text):
    from clearlm.generation.perplexity import perplexity

    med = clearlm.load(smollm2_path, weights="compact")
    set_matmul_precision(med.transformer, "medium")
    ids = smollm2.encode(alice_text)  # 548 tokens
    d = window_distances(smollm2.transformer, med.transformer, ids, 128, 26, chunks=(None,))
    d = d[None]
    print(f"\nSmolLM2 compact + medium vs float32: {d}")
    assert d.n_positions >= 2000
    assert d.max_abs_logit <= SMOL_BOUND["max_abs_logit"]
    assert d.mean_kl <= SMOL_BOUND["mean_kl"] and d.max_kl <= SMOL_BOUND["max_kl"]
    assert d.top1_agreement >= SMOL_BOUND["top1"]
    want, got = perplexity(smollm2.transformer, ids), perplexity(med.transformer, ids)
    print(f"perplexity {want.perplexity:.4f} -> {got.perplexity:.4f}")
    assert abs(got.perplexity / want.perplexity - 1) <= SMOL_BOUND["ppl"]
    if BF16:
        assert d.max_abs_logit > 1e-2  # bfloat16 products, not the compact mode's 1e-4 noise
