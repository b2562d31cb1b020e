"""clearlm.runtime.aot: the ahead-of-time compiled decode step computes the eager step's logits.

Reference: the eager model's own decode_step on the same cache contents (itself checked against
transformers elsewhere). Inductor fuses and reorders float32 ops, so logits agree to float32
rounding (1e-4 on logits of size ~1) and greedy tokens are the same. One package is built for a
tiny 1-layer compact model (~20 s on 2 cores) and shared by the tests of this module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
from clearlm.runtime.aot import (
    AOTDecodeStep,
    AOTError,
    compile_decode_aot,
    max_columns,
    package_key,
)

PROMPT = [1, 72, 101, 108, 108, 111]
CHILD = """
import json, sys
from pathlib import Path
import torch
torch.set_num_threads({threads})
sys.path[:0] = [{tests!r}, {here!r}]
from test_aot import load_compact, run
from clearlm.runtime.aot import AOTDecodeStep, package_key
model = load_compact({path!r})
step = AOTDecodeStep(model, Path({packages!r}))
out, toks, _ = run(model, step, 13, 3)
print(json.dumps({{"built": step.built, "toks": toks, "key": package_key(model),
                  "inductor": "torch._inductor" in sys.modules,
                  "dynamo": "torch._dynamo" in sys.modules, "logits": out[-1][0, :8].tolist()}}))
"""


def load_compact(path):
    loaded = load_gguf_model(path)
    quantize_model(loaded.model, open_gguf(path), loaded.config)
    return loaded.model.eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("aot")
    path = write_tiny_llama(root / "t.gguf", n_layers=1, matrix_type=Q.Q8_0, seed=4)
    model = load_compact(path)
    step = AOTDecodeStep(model, root / "packages")
    return model, step, path, root


def run(model, step, n_cache: int, n: int) -> tuple[list[torch.Tensor], list[int], object]:
    """Greedy: prefill eagerly, then n steps with `step`; every step's logits, tokens, cache."""
    cache = model.new_cache(1, n_cache)
    out, toks = greedy_steps(model, step, torch.tensor([PROMPT]), cache, n)
    return out, toks, cache


@pytest.mark.parametrize("n_cache", [13, 40])  # one package, any cache size (dynamic key axis)
def test_aot_step_matches_eager(tiny, n_cache) -> None:
    model, step, _, root = tiny
    want, want_toks, want_cache = run(model, decode_step, n_cache, 6)
    got, got_toks, got_cache = run(model, step, n_cache, 6)
    assert step.loader is not None and step.path.parent == root / "packages"
    assert step.path.exists() and step.compile_s > 0
    assert got_toks == want_toks
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape == (1, model.config.vocab_size)
        assert (g - w).abs().max().item() < 1e-4
    # the package wrote the keys/values and moved the lengths of the caller's own cache
    assert torch.equal(got_cache.lengths, want_cache.lengths)
    for k, kw in zip(got_cache.keys + got_cache.values, want_cache.keys + want_cache.values,
                     strict=True):
        assert (k - kw).abs().max().item() < 1e-4 and k.abs().sum() > 0


def test_the_package_calls_the_kernel_directly(tiny) -> None:
    """With the C++ kernel, the package's compact products are direct calls of its C shims
    (csrc/qgemv_ops.cpp: aoti_torch_cpu_qmm), not calls through AOTInductor's proxy executor."""
    import zipfile

    from clearlm.quant.kernels import load_kernels

    if load_kernels() is None:
        pytest.skip("no C++ kernel (needs g++)")
    model, step, _, _ = tiny
    run(model, step, 13, 1)  # the module's package, built or loaded
    with zipfile.ZipFile(step.path) as z:
        code = "".join(z.read(n).decode() for n in z.namelist() if n.endswith("wrapper.cpp"))
    assert code.count("aoti_torch_cpu_qmm(") >= 2  # its declaration and the layer's calls
    assert "proxy_executor_call_function" not in code


def test_calls_it_cannot_serve_run_eagerly(tiny) -> None:
    model, step, _, _ = tiny
    run(model, step, 13, 1)  # loaded
    cache = model.new_cache(2, 13)  # two rows: the package takes one
    prefill(model, torch.tensor([PROMPT, PROMPT]), cache)
    tok = torch.tensor([[5], [7]])
    assert not step.serves(model, tok, cache)
    ref = model.new_cache(2, 13)
    prefill(model, torch.tensor([PROMPT, PROMPT]), ref)
    assert torch.equal(step(model, tok, cache), decode_step(model, tok, ref))
    too_long = model.new_cache(1, step.max_columns)  # key axis max_columns + 1
    assert not step.serves(model, tok[:1], too_long)
    other = load_compact(tiny[2])  # another model object: not the package's tensors
    assert not step.serves(other, tok[:1], model.new_cache(1, 13))


def test_rope_tables_are_inputs_of_any_length(tiny, monkeypatch) -> None:
    """The tables are not in the package: a model whose tables start at 8 positions and grow
    with each cache has the package's key, loads it, and every cache size decodes through it
    with the eager step's logits."""
    from clearlm.model.positions import RotaryEmbedding

    model, step, path, root = tiny
    run(model, step, 13, 1)  # the module's package, loaded
    assert not any("rope" in name for name in step.constants)  # no table among its constants
    monkeypatch.setattr(RotaryEmbedding, "TABLE_START", 8)
    lazy = load_compact(path)
    assert len(lazy.rope.cos) == 8 and package_key(lazy) == package_key(model)
    lazy_step = AOTDecodeStep(lazy, root / "packages")
    # a cache whose positions the tables do not reach (made without new_cache) runs eagerly
    unreserved = KVCache(1, 1, lazy.config.n_kv_heads, lazy.config.head_dim, 13, torch.float32)
    assert not lazy_step.serves(lazy, torch.tensor([[5]]), unreserved)
    for n_cache, rows in ((13, 16), (40, 64)):  # new_cache grows the tables: 8 → 16 → 64
        want, want_toks, _ = run(lazy, decode_step, n_cache, 4)
        got, got_toks, cache = run(lazy, lazy_step, n_cache, 4)
        assert len(lazy.rope.cos) == rows and lazy_step.serves(lazy, torch.tensor([[5]]), cache)
        assert got_toks == want_toks
        assert max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) < 1e-4
    assert lazy_step.built is False and lazy_step.path == step.path  # loaded, not rebuilt


def test_hooks_take_the_eager_path(tiny) -> None:
    model, step, _, _ = tiny
    seen = []
    point = model.layers[0].hook_resid_post
    point.fns.append(lambda x, name: seen.append(x.shape))
    try:
        got, _, _ = run(model, step, 13, 2)
    finally:
        point.fns.clear()
    assert len(seen) == 1 + 2  # the prefill and both steps ran through the hook point
    want, _, _ = run(model, decode_step, 13, 2)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))  # eager: bit-equal


def test_generation_uses_it_and_a_new_process_loads_the_package(tiny) -> None:
    model, step, path, root = tiny
    run(model, step, 13, 1)
    model.decode_fn = step
    try:
        greedy = lambda logits, seq: (logits.argmax(-1), torch.zeros(1))  # noqa: E731
        got = [t for t, _ in generate_step(model, PROMPT, greedy, 5)]
    finally:
        model.decode_fn = None
    want = [t for t, _ in generate_step(model, PROMPT, greedy, 5)]
    assert got == want
    # a fresh process: same key (same code, shapes, threads), so it loads without compiling
    child = root / "child.py"
    helpers, here = Path(__file__).parents[1] / "helpers", Path(__file__).parent
    child.write_text(CHILD.format(threads=torch.get_num_threads(), tests=str(helpers),
                                  here=str(here), path=str(path),
                                  packages=str(root / "packages")))
    proc = subprocess.run([sys.executable, str(child)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["key"] == package_key(model)
    assert res["built"] is False  # loaded from disk
    assert not res["inductor"] and not res["dynamo"]  # loading needs neither
    want_out, want_toks, _ = run(model, decode_step, 13, 3)
    assert res["toks"] == want_toks
    assert max(abs(a - b) for a, b in zip(res["logits"], want_out[-1][0, :8].tolist(),
                                           strict=True)) < 1e-4


def test_key_follows_what_the_code_depends_on(tiny) -> None:
    model, _, _, _ = tiny
    key = package_key(model)
    assert key == package_key(model) and len(key) == 24
    layers = [m for m in model.modules() if type(m).__name__ == "QuantLinear"]
    layers[0].int8 = True  # int8 switches are compiled in
    try:
        assert package_key(model) != key
    finally:
        layers[0].int8 = False
    n = torch.get_num_threads()
    torch.set_num_threads(n + 1)  # read when the step runs (cpp.dynamic_threads): one package
    try:
        assert package_key(model) == key
    finally:
        torch.set_num_threads(n)
    assert max_columns(model) == model.config.context_length + 1  # tiny: table = context
    import clearlm.runtime.aot

    with pytest.MonkeyPatch.context() as mp:  # a build without the C++ kernel: another key
        mp.setattr(clearlm.runtime.aot, "load_kernels", lambda: None)
        assert package_key(model) != key


def test_compile_decode_aot_sets_the_generation_step(tiny, tmp_path) -> None:
    import clearlm
    from clearlm.cli.output import decode_kind

    model, _, path, root = tiny
    step = compile_decode_aot(model, root / "packages")  # the module's package: no new build
    try:
        assert model.decode_fn is step and step.loader is None  # built at the first step
        assert decode_kind(step) == "eager" and decode_kind(None) == "eager"  # no step ran
        run(model, step, 13, 1)
        assert decode_kind(step) == "aot"
    finally:
        model.decode_fn = None
    loaded = clearlm.load(path)  # a clearlm.Model: its Transformer gets the step
    step = compile_decode_aot(loaded, tmp_path)
    assert loaded.transformer.decode_fn is step and step.model is loaded.transformer


def test_a_failed_build_warns_once_and_decodes_eagerly(tiny, tmp_path, monkeypatch) -> None:
    import clearlm.runtime.aot

    model = tiny[0]

    def fail(net, path):
        raise AOTError("cannot compile the decode step ahead of time: boom")

    monkeypatch.setattr(clearlm.runtime.aot, "build_package", fail)
    errors = []
    step = AOTDecodeStep(model, tmp_path, on_error=errors.append)
    got, _, _ = run(model, step, 13, 3)
    want, _, _ = run(model, decode_step, 13, 3)
    assert [str(e) for e in errors] == ["cannot compile the decode step ahead of time: boom"]
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    with pytest.raises(AOTError, match="boom"):  # without on_error it raises
        run(model, AOTDecodeStep(model, tmp_path), 13, 1)


def test_the_key_reads_the_code_a_step_runs(tmp_path, monkeypatch) -> None:
    import clearlm.runtime.aot

    for name in ("model/attention.py", "quant/csrc/k.cpp", "cli/app.py", "serve/http.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    monkeypatch.setattr(clearlm.runtime.aot, "_SOURCE", tmp_path)
    digest = clearlm.runtime.aot._code_digest()
    for untraced in ("cli/app.py", "serve/http.py"):  # editing the CLI keeps the packages
        (tmp_path / untraced).write_text("x = 2\n")
        assert clearlm.runtime.aot._code_digest() == digest
    for traced in ("model/attention.py", "quant/csrc/k.cpp"):
        (tmp_path / traced).write_text("x = 3\n")
        assert clearlm.runtime.aot._code_digest() != digest
        digest = clearlm.runtime.aot._code_digest()


def test_cli_names_an_unknown_compile_backend(tiny, monkeypatch) -> None:
    from typer.testing import CliRunner

    from clearlm.cli import app

    monkeypatch.setenv("CLEARLM_COMPILE", "fast")
    got = CliRunner().invoke(app, ["generate", "hi", "-m", str(tiny[2]), "-n", "2", "--compile"],
                             env={"COLUMNS": "200"})
    assert got.exit_code == 2
    assert "CLEARLM_COMPILE must be aot or jit, got 'fast'" in got.output


def test_a_damaged_package_is_named(tiny, tmp_path) -> None:
    import shutil

    model, built, _, _ = tiny
    run(model, built, 13, 1)  # the module's package, built
    step = AOTDecodeStep(model, tmp_path)
    step.package_path().write_bytes(b"not a package")  # no checksum beside it
    with pytest.raises(AOTError, match=r"cannot load .*decode-.*\.pt2 .*delete it to rebuild"):
        run(model, step, 13, 1)
    # a whole package with one byte changed (a copy cut short would crash the loader: SIGBUS)
    shutil.copy(str(built.path) + ".sha256", str(step.package_path()) + ".sha256")
    data = bytearray(built.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    step.package_path().write_bytes(bytes(data))
    with pytest.raises(AOTError, match="checksum does not match"):
        run(model, AOTDecodeStep(model, tmp_path), 13, 1)


def test_what_the_package_cannot_serve_is_refused_before_building(tiny, tmp_path,
                                                                  monkeypatch) -> None:
    import clearlm.runtime.aot
    from clearlm.cli.output import decode_kind

    model = tiny[0]
    a_file = tmp_path / "file"
    a_file.write_text("")
    step = AOTDecodeStep(model, a_file / "aot")  # a cache folder that cannot be made
    with monkeypatch.context() as mp:  # refused before the (seconds-long) export
        mp.setattr(torch.export, "export", lambda *a, **k: pytest.fail("exported first"))
        with pytest.raises(AOTError, match="cannot compile the decode step"):
            run(model, step, 13, 1)
    assert decode_kind(step) == "eager"  # what --json reports: the steps ran eagerly
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # torchrun ranks
    with pytest.raises(AOTError, match="runs in one process"):
        run(model, AOTDecodeStep(model, tmp_path), 13, 1)
    stage = model.new_cache(1, 13)
    stage.keys, stage.values = [], []  # a pipeline stage's cache holds other layers
    assert not step.serves(model, torch.tensor([[1]]), stage)
    monkeypatch.setenv("CLEARLM_CACHE", "~/somewhere")
    assert clearlm.runtime.aot.cache_root() == Path.home() / "somewhere" / "aot"


def test_a_step_building_elsewhere_decodes_eagerly_then_switches(tiny) -> None:
    """start_build: a package not on disk is asked for once (the CLI and the API start
    `clearlm compile` in the background there) and the steps run eagerly, with the eager
    step's values; once the package appears, the next step loads it and runs compiled."""
    import shutil

    model, shared, _, root = tiny
    run(model, shared, 13, 1)  # the module's package, built or loaded
    asked: list[Path] = []
    step = AOTDecodeStep(model, root / "elsewhere", start_build=asked.append)
    step.start_if_missing()  # what the CLI does at load, so its notice precedes the text
    assert asked == [step.package_path()]
    want, want_toks, _ = run(model, decode_step, 13, 4)
    got, got_toks, _ = run(model, step, 13, 4)
    assert asked == [step.package_path()] and step.loader is None  # asked once, eager
    assert got_toks == want_toks and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    # the build "finishes": the package appears (checksum first, then the file, as
    # build_package writes them)
    step.package_path().parent.mkdir(parents=True)
    shutil.copy(shared.path.with_name(shared.path.name + ".sha256"),
                step.package_path().with_name(step.package_path().name + ".sha256"))
    shutil.copy(shared.path, step.package_path())
    got, got_toks, _ = run(model, step, 13, 4)
    assert step.loader is not None and asked == [step.package_path()]
    assert got_toks == want_toks
    assert max((g - w).abs().max().item() for g, w in zip(got, want, strict=True)) < 1e-4


def test_the_build_lock_admits_one_live_process(tmp_path) -> None:
    from clearlm.runtime.aot import lock_path, release_lock, take_lock

    pkg = tmp_path / "decode-x.pt2"
    assert take_lock(pkg) and not take_lock(pkg)  # held by this (live) process
    release_lock(pkg)
    assert not lock_path(pkg).exists() and take_lock(pkg)
    lock_path(pkg).write_text("999999999")  # a process that is gone: its lock is taken over
    assert take_lock(pkg) and lock_path(pkg).read_text() == str(__import__("os").getpid())
