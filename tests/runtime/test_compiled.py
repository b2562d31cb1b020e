"""clearlm.runtime.compiled: the torch.compile'd decode step computes the eager step's logits.

Reference: the eager model's own decode_step on the same cache contents (itself checked against
transformers elsewhere). Inductor may fuse and reorder float32 ops, so logits agree to float32
rounding (1e-4 here on logits of size ~1), and greedy tokens are the same. Tiny 1-layer model:
the compile costs seconds, not minutes."""

from __future__ import annotations

import os

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from greedy_steps import greedy_steps
from tiny_gguf import write_tiny_llama

from clearlm.generation.loop import decode_step, generate_step, prefill
from clearlm.loading.checkpoint import load_gguf_model
from clearlm.loading.compact.swap import quantize_model
from clearlm.loading.gguf import open_gguf
from clearlm.model.kv_cache import KVCache
from clearlm.runtime.compiled import CompiledDecodeStep, cache_dir, compile_decode


@pytest.fixture(scope="module")
def tiny_compact(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("c") / "t.gguf", n_layers=1,
                            matrix_type=Q.Q8_0, seed=4)
    loaded = load_gguf_model(path)
    quantize_model(loaded.model, open_gguf(path), loaded.config)
    return loaded.model.eval()


def new_cache(model, n: int) -> KVCache:
    c = model.config
    return KVCache(c.n_layers, 1, c.n_kv_heads, c.head_dim, n)


def run(model, step, prompt: torch.Tensor, n: int) -> tuple[list[torch.Tensor], list[int]]:
    """Greedy: prefill eagerly, then n steps with `step`; every step's logits and token."""
    return greedy_steps(model, step, prompt, new_cache(model, prompt.shape[1] + n + 1), n)


def test_compiled_step_matches_eager(tiny_compact, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    assert cache_dir() == tmp_path / "inductor"
    prompt = torch.tensor([[1, 72, 101, 108, 108, 111]])  # (1, T)
    want, want_toks = run(tiny_compact, decode_step, prompt, 6)  # cache of 13, as generate's
    step = CompiledDecodeStep(tiny_compact)
    got, got_toks = run(tiny_compact, step, prompt, 6)
    assert step.compile_s is not None and step.compile_s > 0
    assert got_toks == want_toks
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert (g - w).abs().max().item() < 1e-4
    assert any((tmp_path / "inductor").iterdir())  # the compiled graphs were cached there


def test_generation_decodes_with_the_compiled_step(tiny_compact) -> None:
    from clearlm.sampling.chain import SamplingParams, make_sampler

    prompt = [1, 72, 101, 108, 108, 111]
    greedy = SamplingParams(temperature=0.0)
    want = list(generate_step(tiny_compact, prompt, make_sampler(greedy), 7))
    step = compile_decode(tiny_compact)
    try:
        got = list(generate_step(tiny_compact, prompt, make_sampler(greedy), 7))
    finally:
        del tiny_compact.decode_fn
    assert step.compile_s is not None  # generation used it
    assert [t for t, _ in got] == [t for t, _ in want]
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want, strict=True)) < 1e-4


def test_hooks_take_the_eager_path(tiny_compact) -> None:
    step = CompiledDecodeStep(tiny_compact)
    prompt = torch.tensor([[1, 72, 101]])
    seen = []
    point = tiny_compact.layers[0].hook_resid_post
    point.fns.append(lambda x, name: seen.append(x.shape))
    try:
        run(tiny_compact, step, prompt, 2)
    finally:
        point.fns.clear()
    assert step.compile_s is None  # never compiled: every step ran eagerly
    assert len(seen) == 1 + 2  # prefill, then each step's point was called


def test_bad_mode() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        CompiledDecodeStep(torch.nn.Linear(2, 2), mode="fast")


def test_compile_cache_goes_to_clearlm_cache_when_unset(tmp_path) -> None:
    """Without TORCHINDUCTOR_CACHE_DIR, compiled code lands in $CLEARLM_CACHE/inductor, though
    importing torch._inductor sets that variable to torch's /tmp default (a fresh process, as a
    user's: a tiny function compiled after CompiledDecodeStep points Inductor there). The
    function is a matmul, which Inductor hands to an extern kernel: its compiled code is the
    Python wrapper alone (2 s), where an elementwise one also built C++ kernels and Inductor's
    CPU probes in the empty cache (19-37 s)."""
    import subprocess
    import sys

    code = (
        "import torch, clearlm.runtime.compiled as c; c.CompiledDecodeStep(torch.nn.Linear(2, 2)); "
        "print(c.cache_dir()); x = torch.ones(2, 4); "
        "assert torch.equal(torch.compile(lambda x: x @ x.T)(x), x @ x.T)"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["CLEARLM_CACHE"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(tmp_path / "inductor")
    assert any((tmp_path / "inductor").rglob("*.py")), "no compiled code in the cache folder"


def test_stats_line_keeps_the_compile_out_of_the_decode_speed(capsys) -> None:
    """--compile's stats line: the first decode step's compile time is named, and the decode
    speed counts the later steps only (5 tokens: prefill's, the compiling step, 3 more)."""
    from clearlm.cli.output import print_stats
    from clearlm.generation.loop import GenerationResult

    result = GenerationResult("abc", [1, 2, 3, 4, 5], "length", 3, prefill_s=0.5, decode_s=10.5)
    print_stats(result, 100)
    assert "decode 0.4 tok/s" in capsys.readouterr().err  # 4 steps over 10.5 s
    print_stats(result, 100, compile_s=10.0)
    assert "compile 10.0 s (first step) · decode 6.0 tok/s after it" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["aot", "jit"])
def test_cli_generate_compile_flag(tmp_path, monkeypatch, backend) -> None:
    """--compile hands the loaded model to clearlm.runtime.aot.compile_decode_aot
    (CLEARLM_COMPILE=jit:
    clearlm.runtime.compiled.compile_decode), whose step then decodes (recorded here in place of the
    compiled step, so the test compiles nothing)."""
    from typer.testing import CliRunner

    import clearlm.runtime.aot
    import clearlm.runtime.compiled
    from clearlm.cli import app

    calls = []

    def fake_compile(model, **kwargs):
        def step(m, token, cache):
            calls.append(int(token))
            return decode_step(m, token, cache)

        step.package_path = lambda: tmp_path / "p.pt2"
        # --compile builds before the first token: ready() (not built), prepare() (the build)
        step.ready, step.prepare, step.loader = (lambda: False), (lambda: None), None
        model.decode_fn = step
        return step

    monkeypatch.setattr(clearlm.runtime.aot, "compile_decode_aot", fake_compile)
    monkeypatch.setattr(clearlm.runtime.compiled, "compile_decode", fake_compile)
    monkeypatch.setenv("CLEARLM_COMPILE", backend)
    path = write_tiny_llama(tmp_path / "t.gguf", context_length=48)
    args = ["generate", "hello", "-m", str(path), "-n", "4", "-t", "1", "--temperature", "0"]
    want = CliRunner().invoke(app, [*args, "-q"])
    assert want.exit_code == 0 and calls == []
    got = CliRunner().invoke(app, [*args, "-q", "--compile"])
    assert got.exit_code == 0, got.output
    assert got.output == want.output and len(calls) == 3  # 4 tokens: prefill, then 3 steps
    noted = CliRunner().invoke(app, [*args, "--compile"]).output
    assert ("building the compiled decode step" in noted) if backend == "aot" else (
        "compiles" in noted
    )


def test_cli_chat_compile_flag(tmp_path, monkeypatch) -> None:
    """chat --compile decodes through the compiled step too, a one-shot answer and every answer
    of a conversation (the step recorded in place of the compiled one, as above), with the same
    text as eager; the answer whose first step built the step gives that time apart."""
    from typer.testing import CliRunner

    import clearlm.runtime.aot
    from clearlm.cli import app

    calls = []

    def fake_compile(model, **kwargs):
        def step(m, token, cache):
            calls.append(int(token))
            if len(calls) == 1:
                step.compile_s = 0.25  # as a step that compiled on its first call
            return decode_step(m, token, cache)

        step.package_path = lambda: tmp_path / "p.pt2"
        step.ready, step.prepare, step.loader = (lambda: False), (lambda: None), None
        step.built, step.compile_s = True, None
        model.decode_fn = step
        return step

    monkeypatch.setattr(clearlm.runtime.aot, "compile_decode_aot", fake_compile)
    path = write_tiny_llama(tmp_path / "t.gguf", context_length=96)
    args = ["chat", "-m", str(path), "-n", "4", "-t", "1", "--temperature", "0"]
    want = CliRunner().invoke(app, [*args, "hello", "-q"])
    assert want.exit_code == 0 and calls == []
    got = CliRunner().invoke(app, [*args, "hello", "-q", "--compile"])
    assert got.exit_code == 0, got.output
    assert got.output == want.output and len(calls) >= 1
    eager = CliRunner().invoke(app, [*args, "-q"], input="hello\nagain\n")
    calls.clear()
    got = CliRunner().invoke(app, [*args, "--compile"], input="hello\nagain\n",
                             env={"COLUMNS": "200"})
    assert got.exit_code == 0, got.output
    assert got.stdout == eager.stdout and len(calls) >= 2  # both answers took steps
    assert got.stderr.count("compile 0.2 s (first step)") == 1  # the first answer only


def test_compiled_step_writes_the_cache_in_place(tiny_compact, monkeypatch, tmp_path) -> None:
    """The compiled step writes each new key/value into the cache buffers themselves: Inductor's
    code allocates no buffer of the cache's shape (a scatter_ into a slot view was compiled as a
    copy of the whole buffer per layer and step, written back afterwards)."""
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    c = tiny_compact.config
    cache = new_cache(tiny_compact, 37)  # buffers (1, K, 38, Hd): a shape nothing else has
    logits = prefill(tiny_compact, torch.tensor([[1, 72, 101]]), cache)
    step = CompiledDecodeStep(tiny_compact)
    token = logits.argmax(-1, keepdim=True)  # (1, 1)
    _, code = run_and_get_code(step, tiny_compact, token, cache)
    shape = f"(1, {c.n_kv_heads}, 38, {c.head_dim})"
    assert code and shape in "\n".join(code)  # the cache is an input of the graph
    allocs = [line for src in code for line in src.splitlines() if "empty_strided" in line]
    assert not [line for line in allocs if shape in line], allocs
    assert cache.offset == 4 and cache.keys[0][0, :, 3].abs().sum() > 0  # the step wrote key 3


def test_later_calls_skip_guards_only_for_inputs_seen_before(tiny_compact) -> None:
    """After its first call the step skips Dynamo's guards for inputs it has seen (the key:
    shapes, int8 switches); a cache of another size or an int8 switch is new and runs the full
    guards, so it gets a graph of its own: every step still equals the eager one."""
    from clearlm.quant.linear import set_int8_activations
    from clearlm.quant.ops import int8_available

    step = CompiledDecodeStep(tiny_compact)
    prompt = torch.tensor([[1, 72, 101, 108]])
    for n in (5, 9, 5):  # caches of 10 and 14 positions, then 10 again
        want, _ = run(tiny_compact, decode_step, prompt, n)
        got, _ = run(tiny_compact, step, prompt, n)
        assert max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) < 1e-4
    assert len(step.seen) == 2
    if not int8_available():
        pytest.skip("the int8 kernel is not built on this CPU")
    exact, _ = run(tiny_compact, decode_step, prompt, 5)
    set_int8_activations(tiny_compact)
    try:
        want, _ = run(tiny_compact, decode_step, prompt, 5)
        got, _ = run(tiny_compact, step, prompt, 5)
    finally:
        set_int8_activations(tiny_compact, False)
    assert max((w - e).abs().max().item() for w, e in zip(want, exact, strict=True)) > 1e-3
    assert max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) < 1e-4
    assert len(step.seen) == 3


def test_a_token_of_other_strides_is_a_new_input(tiny_compact) -> None:
    """A (1, 1) token sliced out of a longer row has strides (T, 1): another graph input than a
    fresh (1, 1) tensor for Dynamo, and another key here, so the step never runs a graph that
    does not fit (Dynamo refuses to, under skip_guard_eval_unsafe)."""
    step = CompiledDecodeStep(tiny_compact)
    prompt = torch.tensor([[1, 72, 101, 108]])
    cache = new_cache(tiny_compact, 12)
    prefill(tiny_compact, prompt, cache)
    step(tiny_compact, prompt[:, 1:2], cache)  # strides (4, 1)
    want_cache = new_cache(tiny_compact, 12)
    prefill(tiny_compact, prompt, want_cache)
    decode_step(tiny_compact, prompt[:, 1:2], want_cache)
    tok = torch.tensor([[108]])  # strides (1, 1)
    got, want = step(tiny_compact, tok, cache), decode_step(tiny_compact, tok, want_cache)
    assert (got - want).abs().max().item() < 1e-4
    assert len(step.seen) == 2
