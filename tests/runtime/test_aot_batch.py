"""clearlm.runtime.aot_batch: the serving engine's decode pass, compiled ahead of time, gives
each request the tokens of its run alone.

References: the eager engine (clearlm.engine.scheduler, itself checked against each prompt run
alone) and ``model.generate`` of each prompt alone, eagerly. Inductor reorders float32 sums, so
logprobs agree to 1e-4 and greedy tokens are the same; sampled tokens too (the seeded draws
would have to fall within ~1e-5 of a boundary to differ). One package is built for a tiny
1-layer compact model (~30-40 s on 2 cores) and shared by the tests of this module; it serves
every row count 1..ROWS (the batch axis is a dynamic dimension)."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.api.decode import attach_batch_decode
from clearlm.engine import Request
from clearlm.engine.scheduler import BatchEngine
from clearlm.runtime.aot import checksum_path, failed_path
from clearlm.runtime.aot_batch import ROWS, BatchDecodeStep
from clearlm.sampling.chain import SamplingParams
from clearlm.serve import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import serve_load  # noqa: E402

GREEDY = SamplingParams(temperature=0)
SAMPLED = SamplingParams(temperature=0.9, top_k=40, seed=7)


class Counted:
    """Wraps a step: the row count of every pass it served (returned logits for)."""

    def __init__(self, step: BatchDecodeStep) -> None:
        self.step, self.rows = step, []

    def __call__(self, model, tokens, positions, cache, n_keys):
        out = self.step(model, tokens, positions, cache, n_keys)
        if out is not None:
            self.rows.append(tokens.shape[0])
        return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("aotb")
    path = write_tiny_llama(root / "t.gguf", n_layers=1, matrix_type=Q.Q8_0, seed=4)
    model = clearlm.load(path, decode="eager")
    assert model.weights == "compact"
    step = BatchDecodeStep(model.transformer, root / "packages")
    step.prepare()  # built here, once for the module
    return model, step, root


def run(engine: BatchEngine, joins: dict[int, list[Request]]) -> dict:
    """Step until done, adding joins[k] before step k: id → [(token, logprob)]."""
    out: dict = {}
    k = 0
    while engine.has_work() or any(s >= k for s in joins):
        for r in joins.get(k, []):
            engine.add(r)
        for e in engine.step():
            out.setdefault(e.request_id, []).append((e.token, e.logprob))
        k += 1
    return out


def test_engine_rows_equal_the_eager_engine_and_each_run_alone(tiny) -> None:
    model, step, _ = tiny
    net = model.transformer
    prompts = {r: model.encode(t) for r, t in
               (("a", "hello world"), ("b", "the quick brown fox"), ("c", "x y"))}

    def joins():  # a alone, then b and c join (3 rows), then a and b end (c alone, slot 2)
        return {0: [Request("a", prompts["a"], GREEDY, 6)],
                3: [Request("b", prompts["b"], SAMPLED, 5), Request("c", prompts["c"], GREEDY, 12)]}

    want = run(BatchEngine(net, max_batch=4, max_seq_len=40, key_bucket=8), joins())
    counted = Counted(step)
    net.batch_decode_fn = counted
    try:
        got = run(BatchEngine(net, max_batch=4, max_seq_len=40, key_bucket=8), joins())
    finally:
        net.batch_decode_fn = None
    assert {1, 3} <= set(counted.rows)  # one row, then three
    for rid in "abc":
        assert [t for t, _ in got[rid]] == [t for t, _ in want[rid]], rid
        assert max(abs(g - w) for (_, g), (_, w) in zip(got[rid], want[rid], strict=True)) < 1e-4
    alone = {r: model.generate(prompts[r], max_new_tokens=n, params=p).tokens
             for r, n, p in (("a", 6, GREEDY), ("b", 5, SAMPLED), ("c", 12, GREEDY))}
    assert {r: [t for t, _ in got[r]] for r in "abc"} == alone


def test_served_streams_equal_their_runs_alone(tiny) -> None:
    """Through the HTTP server: 4 concurrent sampled streams, each equal to its prompt and
    seed run alone (eagerly, through model.generate)."""
    model, step, _ = tiny
    counted = Counted(step)
    model.transformer.batch_decode_fn = counted
    try:
        with serving(create_app(model, model_id="m")) as url:
            outcomes, _ = asyncio.run(serve_load.run_load(url, "m", 4, 1, 8, temperature=0.8))
    finally:
        model.transformer.batch_decode_fn = None
    assert counted.rows and max(counted.rows) > 1
    for o in outcomes:
        assert o.error is None
        want = model.generate(o.prompt, max_new_tokens=8, temperature=0.8, seed=o.seed)
        assert (o.text, o.completion_tokens) == (want.text, len(want.tokens)), o


def test_passes_it_cannot_serve_run_eagerly(tiny) -> None:
    model, step, _ = tiny
    net = model.transformer
    tok, pos = torch.tensor([[5]]), torch.tensor([[3]])
    cache = net.new_cache(ROWS + 1, 16)
    assert step(net, tok, pos, cache, 8) is not None  # loaded, one row
    many = torch.full((ROWS + 1, 1), 5)  # more rows than the package (the kernel) takes
    assert step(net, many, many, cache, 8) is None
    assert step(net, tok, pos, cache, 17) is None  # more keys than the cache holds
    point = net.layers[0].hook_resid_post
    point.fns.append(lambda x, name: None)
    try:
        assert step(net, tok, pos, cache, 8) is None  # hooks see every value: eager
    finally:
        point.fns.clear()


def test_a_step_building_elsewhere_decodes_eagerly_then_switches(tiny, tmp_path) -> None:
    model, step, _ = tiny
    net = model.transformer
    started = []
    later = BatchDecodeStep(net, tmp_path, start_build=started.append)
    cache = net.new_cache(2, 16)
    tok, pos = torch.tensor([[5], [6]]), torch.tensor([[0], [0]])
    assert later(net, tok, pos, cache, 8) is None and later(net, tok, pos, cache, 8) is None
    assert started == [later.package_path()]  # the build started once
    for p in (step.path, checksum_path(step.path)):  # the build finishes: the package appears
        shutil.copy(p, tmp_path / p.name)
    assert later(net, tok, pos, cache, 8) is not None and later.built is False


def test_attach_warns_once_after_a_failed_build_and_eager_attaches_nothing(tiny, tmp_path,
                                                                           monkeypatch) -> None:
    model, _, _ = tiny
    monkeypatch.setenv("CLEARLM_CACHE", str(tmp_path))
    notices: list[str] = []
    assert attach_batch_decode(model, "eager", notices.append) is None and notices == []
    path = BatchDecodeStep(model.transformer).package_path()
    path.parent.mkdir(parents=True)
    failed_path(path).write_text("AOTError: no compiler\n")
    try:
        step = attach_batch_decode(model, "auto", notices.append)
        assert model.transformer.batch_decode_fn is step
        tok = torch.tensor([[5]])
        assert step(model.transformer, tok, tok, model.transformer.new_cache(1, 16), 8) is None
    finally:
        model.transformer.batch_decode_fn = None
    assert len(notices) == 1 and notices[0].startswith("warning: the compiled batched step "
                                                       "failed to build before (AOTError: no")


def test_serve_takes_generates_decode_and_weight_options() -> None:
    from typer.testing import CliRunner

    from clearlm.cli import app

    res = CliRunner().invoke(app, ["serve", "--compile", "--eager"])
    assert res.exit_code == 2 and "--compile and --eager contradict" in res.output
    res = CliRunner().invoke(app, ["serve", "--weights", "packed"])
    assert res.exit_code == 2 and "compact" in res.output  # generate's --weights, its check
