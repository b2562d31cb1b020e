"""The int8-activation kernel and the clearlm::qmm custom op.

int8 (opt-in): x is rounded per block of 32 to dx·xq with |x - dx·xq| ≤ dx/2, dx = max|x|/127,
and the rest is exact integer arithmetic plus float32 sums, so against the float64 product with
the dequantized weight |Δy[n]| ≤ Σ_b dx_b/2 · Σ_{k∈b} |W[n, k]| (+ the float32 summation bound).
The bound is computed here from x and gguf's own dequantized W, independently of the kernel.
Custom op: the same numbers as the eager layer, and torch.compile traces it as one node."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_quant import U, random_blocks

from clearlm.quant import ops
from clearlm.quant.kernels import load_kernels
from clearlm.quant.linear import QuantLinear, set_int8_activations
from clearlm.quant.ops import int8_available
from clearlm.quant.pack import REPACKED, pack_blocks

needs_int8 = pytest.mark.skipif(not int8_available(),
                                reason="no int8 kernel built (AVX-512 VNNI or AVX2)")


def layer_and_weight(qtype: Q, n: int, k: int, seed: int = 5):
    raw = random_blocks(qtype, n, k, seed=seed)
    w = torch.from_numpy(dequantize(raw, qtype).reshape(n, k))  # (N, K) float32
    return QuantLinear(pack_blocks(raw, qtype, (n, k))), w


# IQ4's table codes and Q6_K's / Q3_K's / Q2_K's
# field codes stay exact: test_quant_kfiles.py, test_quant_iq4.py, test_quant_kheads.py
WITH_INT8_BODY = [q for q in REPACKED if q not in (Q.IQ4_NL, Q.IQ4_XS, Q.Q6_K, Q.Q3_K, Q.Q2_K)]


@needs_int8
@pytest.mark.parametrize("qtype", WITH_INT8_BODY, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 3])
def test_int8_activations_within_rounding_bound(qtype: Q, m: int) -> None:
    n, k = 72, 512
    layer, w = layer_and_weight(qtype, n, k)
    x = torch.randn(m, k) * torch.linspace(0.01, 4, k)  # (M, K): blocks of very different scale
    x[0, :32] = 0.0  # an all-zero block (dx = 0)
    ref = x.double() @ w.double().T  # (M, N)
    exact = layer(x)
    assert set_int8_activations(layer) == 1
    got = layer(x)
    dx = x.view(m, -1, 32).abs().amax(-1) / 127  # (M, K/32)
    bound = (dx[:, None, :] / 2 * w.abs().view(n, -1, 32).sum(-1)[None]).sum(-1)  # (M, N)
    bound = bound.double() + 2 * k * U * (x.abs() @ w.abs().T).double()
    err = (got.double() - ref).abs()
    assert (err <= bound).all(), f"max |Δ| {err.max().item():.3g}"
    assert err.max() > (exact.double() - ref).abs().max()  # it really rounds x
    set_int8_activations(layer, False)
    assert torch.equal(layer(x), exact)


@needs_int8
@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=lambda q: q.name)
def test_int8_activations_leave_field_codes_exact(qtype: Q) -> None:
    """Q6_K's, Q3_K's and Q2_K's field codes (quant/kheads.py) have no int8 body: the product
    stays the exact one."""
    layer, _ = layer_and_weight(qtype, 72, 512)
    x = torch.randn(3, 512)
    exact = layer(x)
    set_int8_activations(layer)
    assert torch.equal(layer(x), exact)


@needs_int8
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda q: q.name)
@pytest.mark.parametrize("where", [0, 17, 40, 511])
def test_int8_activations_keep_a_nan_as_f_linear_does(qtype: Q, where: int) -> None:
    """A NaN anywhere in a row of x makes that row's every output NaN (F.linear's), whatever
    lane of the block it sits in; the other rows stay finite."""
    layer, w = layer_and_weight(qtype, 16, 512)
    x = torch.randn(2, 512)
    x[1, where] = float("nan")
    ref = F.linear(x, w)
    set_int8_activations(layer)
    got = layer(x)
    assert torch.isnan(ref[1]).all() and torch.isnan(got[1]).all()
    assert torch.isfinite(got[0]).all()


@needs_int8
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q5_0, Q.Q4_K], ids=lambda q: q.name)
def test_int8_rows_out_of_range_are_computed_exactly(qtype: Q) -> None:
    """A row with a block whose max |x| is outside [2^-64, 2^64] (or infinite) takes the exact
    product: 127 / max|x| overflowed below 3.7e-37 (every xq -128, answers 46-273x over the
    bound) and dx·Σxq above 1e37 (inf where F.linear is finite). The other rows stay int8."""
    layer, w = layer_and_weight(qtype, 16, 256)
    x = torch.randn(5, 256)
    x[1] *= 1e-37  # 127 / max|x| would overflow
    x[2, :32] = 1e30  # above 2^64 (from 1e37 on, dx·Σxq overflowed in the mins' term)
    x[3, 64:96] = 0.0  # one block with a tiny maximum
    x[3, 70] = 2.0**-70
    x[4, 7] = float("inf")
    exact = layer(x)
    set_int8_activations(layer)
    got = layer(x)
    assert torch.equal(got[1:4], exact[1:4])
    assert torch.equal(got[4].isnan(), exact[4].isnan()) and torch.equal(
        got[4].nan_to_num(), exact[4].nan_to_num())
    assert not torch.equal(got[0], exact[0])  # row 0 is ordinary: rounded
    ref = (x[1:3].double() @ w.double().T)  # the exact rows are close to float64
    assert torch.isfinite(got[1:3]).all()
    assert ((got[1:3].double() - ref).abs() <= 1e-4 * (x[1:3].abs().double() @
                                                       w.abs().double().T)).all()


@needs_int8
def test_int8_falls_back_to_exact_when_k_is_not_a_multiple_of_64() -> None:
    layer, w = layer_and_weight(Q.Q8_0, 16, 96)
    x = torch.randn(1, 96)
    exact = layer(x)
    set_int8_activations(layer)
    assert torch.equal(layer(x), exact)


@pytest.mark.parametrize("int8", [False, True])
def test_custom_op_equals_eager_layer(int8: bool) -> None:
    layer, w = layer_and_weight(Q.Q4_1, 48, 128)
    layer.int8 = int8
    bias = torch.randn(48)
    layer.bias = bias
    x = torch.randn(2, 128)
    got = torch.ops.clearlm.qmm(x, layer.codes, layer.scale, layer.min, layer.bits, layer.block,
                                int8) + bias
    assert torch.equal(got, layer(x))
    if not int8:
        assert (got - F.linear(x, w, bias)).abs().max() < 1e-4
    if load_kernels() is not None:  # the C++ operator a compiled graph calls
        # (without the int8 kernel the layer computes the exact product: ops.compiled_qmm's choice)
        i8 = int8 and int8_available()
        op = torch.ops.clearlm_kernels.qmm_i8 if i8 else torch.ops.clearlm_kernels.qmm
        got = op(x, layer.codes, layer.scale, layer.min, layer.bits, layer.block) + bias
        assert torch.equal(got, layer(x))


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "no-kernel"])
def test_custom_op_compiles_without_graph_break(kernel: bool, monkeypatch) -> None:
    if kernel and load_kernels() is None:
        pytest.skip("no C++ compiler")
    if not kernel:  # the Python custom op (dequantize + matmul)
        monkeypatch.setattr(ops, "_kernel_ops", lambda: False)
    layer, _ = layer_and_weight(Q.Q8_0, 32, 64)
    x = torch.randn(1, 1, 64)  # (B, T, K): decode-sized
    torch._dynamo.reset()
    explained = torch._dynamo.explain(layer)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    ops_called = {str(n.target) for g in explained.graphs for n in g.graph.nodes}
    assert ("clearlm_kernels.qmm" if kernel else "clearlm.qmm") in ops_called
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), layer(x))


def test_load_with_int8_activations(tmp_path) -> None:
    """clearlm.load(activations="int8") switches every compact layer; its decode logits move by
    int8 rounding (within the bound above, layer by layer), and bad requests are refused."""
    from tiny_gguf import write_tiny_llama

    import clearlm
    from clearlm.errors import SamplingParamsError
    from clearlm.generation.loop import decode_step, prefill
    from clearlm.inspect.distance import cache_for

    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=2)
    exact = clearlm.load(path, threads=1)
    rounded = clearlm.load(path, threads=1, activations="int8")
    layers = [m for m in rounded.transformer.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.int8 for m in layers)
    assert not any(m.int8 for m in exact.transformer.modules() if isinstance(m, QuantLinear))
    assert exact.activations == "float32"
    assert rounded.activations == ("int8" if int8_available() else "float32")
    assert clearlm.load(path, threads=1, activations=None).activations == "float32"
    tokens = torch.tensor([[1, 72, 101, 108]])
    got = []
    for m in (exact, rounded):
        cache = cache_for(m.transformer, 8)
        prefill(m.transformer, tokens, cache)
        got.append(decode_step(m.transformer, torch.tensor([[111]]), cache))
    if int8_available():
        assert 0 < (got[0] - got[1]).abs().max().item() < 0.05
    for kwargs, message in (
        ({"activations": "int4"}, "unknown activations 'int4'; use float32 or int8"),
        ({"activations": "int8", "weights": "float32"}, "int8 activations are a compact"),
    ):
        with pytest.raises(SamplingParamsError, match=message):
            clearlm.load(path, threads=1, **kwargs)
    f32 = write_tiny_llama(tmp_path / "f.gguf", matrix_type=Q.F32)
    with pytest.raises(SamplingParamsError, match="apply to compact .* has none"):
        clearlm.load(f32, threads=1, activations="int8")


def test_cli_activations_option(tmp_path) -> None:
    """--activations int8 on the command line: the loading line says so; a bad value is a usage
    error (exit 2), int8 with float32 weights one error line (exit 7), no traceback."""
    import subprocess
    import sys

    from tiny_gguf import write_tiny_llama

    path = str(write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, context_length=48))
    base = [sys.executable, "-m", "clearlm", "generate", "hello", "-m", path, "-n", "3", "-t", "1",
            "--temperature", "0"]

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *extra], capture_output=True, text=True, timeout=300)

    ok = run("--activations", "int8")
    assert ok.returncode == 0, ok.stderr
    if int8_available():
        assert "· int8 activations" in ok.stderr  # the loading line
    # without the int8 kernel: one warning line in the CLI's words, no Python warning, and the
    # loading line does not claim int8 (forced here by CLEARLM_NO_KERNELS=1)
    plain = subprocess.run([*base, "--activations", "int8"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "CLEARLM_NO_KERNELS": "1"})
    assert plain.returncode == 0, plain.stderr
    lines = plain.stderr.strip().splitlines()
    assert lines[0] == ("warning: --activations int8 needs the int8 kernel (AVX-512 VNNI or "
                        "AVX2), which is not built here; decode stays exact float32")
    assert "UserWarning" not in plain.stderr and "int8 activations" not in plain.stderr
    bad = run("--activations", "int4")
    assert bad.returncode == 2 and "'int4' is not one of float32, int8" in bad.stderr
    f32 = run("--activations", "int8", "--weights", "float32")
    assert f32.returncode == 7 and "Traceback" not in f32.stderr
    assert f32.stderr.strip().splitlines() == [
        "error: int8 activations are a compact-weight mode; use weights compact (the default "
        "for a quantized GGUF in float32 on the CPU)"]
    half = run("--activations", "int8", "--dtype", "bfloat16")  # the dtype is what to change
    assert half.returncode == 7 and half.stderr.strip().splitlines() == [
        "error: int8 activations are a compact-weight mode; use dtype float32 (compact weights "
        "compute in float32)"]


def test_logprobs_are_those_the_tokens_were_drawn_from(tmp_path) -> None:
    """With int8 activations a decode step's logits differ from a forward over the whole
    sequence (more than 16 rows: exact float32); --logprobs (cli.output.token_logprobs)
    reports the decode steps', so greedy's token is the top of what it reports, every step."""
    from tiny_gguf import write_tiny_llama

    import clearlm
    from clearlm.cli.output import token_logprobs

    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=3, context_length=64)
    model = clearlm.load(path, threads=1, activations="int8")
    prompt = model.encode("hello world, once again")  # > 16 tokens: the forward is exact float32
    assert len(prompt) > 16
    result = model.generate(prompt, max_new_tokens=8, temperature=0)
    steps = token_logprobs(model, prompt, result.tokens, 3, 8)
    assert [s["id"] for s in steps] == result.tokens
    for s in steps:
        assert s["top"][0]["id"] == s["id"] and s["top"][0]["logprob"] == s["logprob"]
    full = torch.log_softmax(model.logits(prompt + result.tokens[:-1])[len(prompt) - 1 :], -1)
    gap = max(abs(t["logprob"] - float(full[n, t["id"]])) for n, s in enumerate(steps)
              for t in s["top"])  # over the reported top 3 of every step
    print(f"\nlargest |Δ logprob| decode steps vs one forward: {gap:.3g}")
    if int8_available():
        assert gap > 1e-5  # the two computations do differ under int8 activations
    assert gap < 0.05  # by int8 rounding only


def test_cli_option_names_are_the_api_s() -> None:
    """cli/app.py spells the --weights and --activations choices itself (it must not import
    torch at start-up); they are the values clearlm.api.options accepts."""
    from clearlm.api.options import ACTIVATIONS, WEIGHTS
    from clearlm.cli.app import ACTIVATION_NAMES, WEIGHT_NAMES

    assert ACTIVATION_NAMES == ACTIVATIONS and WEIGHT_NAMES == WEIGHTS
