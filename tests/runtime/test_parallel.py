"""Tensor and pipeline parallel on 2 local CPU ranks (gloo, 127.0.0.1), against one process.

One launch of two ranks (tests/helpers/parallel_worker.py) runs every case in both modes: tiny
random
models of all 11 model types clearlm reads (through their safetensors folders), a tiny Q8_0
llama GGUF (row-sliced quantized reads, llama.cpp's Q/K permutation) and SmolLM2-135M's GGUF
(9 heads and 3 key/value heads over 2 ranks: the uneven split with repeated key/value heads).
Each case: logits of a 2 × 10 batch within 1e-4 of one process, and 8 greedy tokens with the
KV cache identical. Then the failures: a rank that dies and a rendezvous that cannot be
reached end with one line and exit code 11 within the time limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from hf_tiny import batch_tokens, save_tiny
from parallel_run import clearlm_cmd, free_port, rank_env, run_ranks
from parallel_worker import greedy
from test_family_gemma_phi3 import CASES as GEMMA_PHI3
from test_family_gpt2_opt_xglm import CASES as GPT2_OPT_XGLM
from test_family_llama import CASES as LLAMA
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import DistributedError
from clearlm.loading.checkpoint import open_checkpoint
from clearlm.runtime.parallel import launch
from clearlm.runtime.parallel.pipeline import PipelineStage, stage_plan
from clearlm.runtime.parallel.place import load_placed
from clearlm.runtime.parallel.slicing import Take, _read_gguf_part, read_gguf_part
from clearlm.runtime.parallel.tensor import head_split, shard_plan

DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
WORKER = str(Path(__file__).parents[1] / "helpers" / "parallel_worker.py")
HF_CASES = {  # one per model type (11), plus llama untied
    **{k: LLAMA[k] for k in ("llama", "llama-tied", "mistral-window", "qwen2", "qwen3")},
    **{k: GEMMA_PHI3[k] for k in ("gemma", "gemma2-softcap", "gemma3", "phi3-partial-window")},
    **{k: GPT2_OPT_XGLM[k] for k in ("gpt2-untied", "opt-350m-like", "xglm")},
}
NINE_HEADS = dict(n_heads=9, n_kv_heads=3)  # SmolLM2's: 5 + 4 heads, unequal kv groups
NAMES = [*HF_CASES, "llama-gguf-q8_0", "llama-gguf-9-heads", "smollm2"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, smollm2_path):
    """{case: {mode: (logits, greedy)}} from one 2-rank launch, and the cases' paths."""
    tmp = tmp_path_factory.mktemp("parallel")
    paths = {}
    for name, (cls, config) in HF_CASES.items():
        save_tiny(cls, config, tmp / name)
        paths[name] = str(tmp / name)
    q8 = write_tiny_llama(tmp / "q8.gguf", matrix_type=GGMLQuantizationType.Q8_0, d_model=128)
    h9 = write_tiny_llama(tmp / "h9.gguf", d_model=144, **NINE_HEADS)
    paths["llama-gguf-q8_0"], paths["llama-gguf-9-heads"] = str(q8), str(h9)
    paths["smollm2"] = str(smollm2_path)
    tokens = (batch_tokens(length=10) % 247 + 3).tolist()  # inside every vocabulary here
    prompt = (batch_tokens(seed=2, batch=1, length=6)[0] % 247 + 3).tolist()
    jobs = [
        dict(path=paths[n], mode=m, tokens=tokens, prompt=prompt, n=8)
        for n in NAMES
        for m in ("tensor", "pipeline")
    ]
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    cmd = [sys.executable, WORKER, str(tmp / "jobs.json"), str(tmp / "out.pt")]
    start = time.perf_counter()
    done = run_ranks([cmd, cmd], timeout_s=240)
    print(f"\n2 ranks, {len(jobs)} jobs: {time.perf_counter() - start:.1f} s")
    for p in done:
        assert p.returncode == 0, p.stderr[-2000:]
    results = torch.load(tmp / "out.pt")
    by_case: dict = {}
    for i, job in enumerate(jobs):
        name = NAMES[i // 2]
        by_case.setdefault(name, {})[job["mode"]] = results[i]
    return by_case, paths, tokens, prompt


@pytest.mark.parametrize("name", NAMES)
def test_parallel_matches_one_process(two_ranks, name):
    by_case, paths, tokens, prompt = two_ranks
    model = open_checkpoint(paths[name]).load().model
    with torch.inference_mode():
        ref = model(torch.tensor(tokens))  # (B, T, V)
    ref_greedy = greedy(model, prompt, 8)
    for mode in ("tensor", "pipeline"):
        got = by_case[name][mode]
        diff = (got["logits"] - ref).abs().max().item()
        print(f"\n{name} {mode}: max |Δlogit| = {diff:.2e}")
        assert got["logits"].shape == ref.shape
        assert diff <= 1e-4
        assert got["greedy"] == ref_greedy


def test_head_split_cases():
    # even: 14 heads, 2 kv heads (Qwen2.5-0.5B) → 7 + 7 heads, one kv head each
    assert head_split(14, 2, 0, 2) == (list(range(7)), [0])
    assert head_split(14, 2, 1, 2) == (list(range(7, 14)), [1])
    # SmolLM2: 9 heads, 3 kv heads (3 queries each): 5 + 4 heads, groups unequal → one per query
    assert head_split(9, 3, 0, 2) == ([0, 1, 2, 3, 4], [0, 0, 0, 1, 1])
    assert head_split(9, 3, 1, 2) == ([5, 6, 7, 8], [1, 2, 2, 2])
    # fewer kv heads than ranks: the one kv head is replicated
    assert head_split(4, 1, 1, 2) == ([2, 3], [0])


def test_ranks_read_only_their_part(tmp_path):
    """SmolLM2's head layout (9 heads, 3 key/value heads) on a 4-block F32 llama GGUF: pipeline
    rank 0 of 2 reads blocks 0-1 and the embedding, nothing of blocks 2-3 nor the final norm;
    tensor rank 1 reads 4 of the 9 heads, one key/value head per query head, half of d_ff."""
    path = write_tiny_llama(tmp_path / "h9.gguf", d_model=144, n_layers=4, **NINE_HEADS)
    ckpt = open_checkpoint(path)
    c = ckpt.config
    first = read_gguf_part(ckpt.reader, c, stage_plan(c, 0, 2))
    layers = {int(k.split(".")[1]) for k in first if k.startswith("layers.")}
    assert layers == {0, 1}
    assert "embed_tokens.weight" in first and "norm.weight" not in first
    tp = read_gguf_part(ckpt.reader, c, shard_plan(c, 1, 2))
    assert tp["layers.0.self_attn.q_proj.weight"].shape == (4 * 16, 144)
    assert tp["layers.0.self_attn.k_proj.weight"].shape == (4 * 16, 144)  # kv head per query
    assert tp["layers.0.self_attn.o_proj.weight"].shape == (144, 4 * 16)
    assert tp["layers.0.mlp.down_proj.weight"].shape == (144, 64)
    assert tp["embed_tokens.weight"].shape == (131, 144)  # 262 tokens: rows 131-261


@pytest.mark.parametrize(
    "kind",
    [dict(matrix_type=GGMLQuantizationType.Q8_0, d_model=128), dict(d_model=144, **NINE_HEADS)],
    ids=["q8_0", "f32-9-heads"],
)
def test_slices_equal_the_whole_tensors_cut(tmp_path, kind):
    """Every tensor-parallel slice read from a llama GGUF (Q8_0: rows of quantized data; F32
    with 9 heads: repeated key/value rows; llama.cpp's Q/K permutation undone per head) equals
    the whole model's tensor, cut."""
    path = write_tiny_llama(tmp_path / "q.gguf", **kind)
    ckpt = open_checkpoint(path)
    whole = ckpt.load().model.state_dict()
    for rank in (0, 1):
        plan = shard_plan(ckpt.config, rank, 2)
        part = read_gguf_part(ckpt.reader, ckpt.config, plan)
        assert set(part) == set(whole) - {"lm_head.weight"}  # tied: made from the embedding
        for name, t in part.items():
            assert torch.equal(t, plan(name).apply(whole[name])), name


def test_column_cut_off_block_boundaries(tmp_path):
    """A column range that splits Q8_0's 32-value blocks is dequantized whole, then cut."""
    path = write_tiny_llama(tmp_path / "q.gguf", matrix_type=GGMLQuantizationType.Q8_0, d_model=128)
    t = next(t for t in GGUFReader(str(path)).tensors if t.name == "blk.0.attn_output.weight")
    full = dequantize(t.data, t.tensor_type).reshape(128, 128)
    for cols in ((0, 48), (32, 64), (40, 128)):
        got = _read_gguf_part(t, Take(cols=cols), "q.gguf")
        assert np.array_equal(got, full[:, cols[0] : cols[1]])
    assert np.array_equal(_read_gguf_part(t, Take(rows=(5, 6, 99)), "q.gguf"), full[[5, 6, 99]])


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return str(write_tiny_llama(tmp_path_factory.mktemp("fail") / "tiny.gguf"))


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("loading")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_rank_killed_mid_generation(tiny_gguf, tmp_path):
    """Rank 1 exits abruptly at decode step 3 of 8: rank 0, waiting for the logits it broadcasts,
    ends with one line and exit code 11 at once (the closed socket), not after a timeout."""
    job = dict(path=tiny_gguf, mode="pipeline", tokens=[[5, 6]], prompt=[5, 6, 7], n=8)
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    cmd = [sys.executable, WORKER, str(tmp_path / "jobs.json"), str(tmp_path / "out.pt")]
    start = time.perf_counter()
    rank0, rank1 = run_ranks([cmd, cmd], timeout_s=120, env={1: {"PARALLEL_TEST_DIE_AT_STEP": "3"}})
    assert time.perf_counter() - start < 90  # startup on a busy host; a hang is killed at 120 s
    assert rank1.returncode == 1
    assert rank0.returncode == 11
    line = _one_error_line(rank0.stderr)
    assert line.startswith("error: rank 0: lost the other ranks during"), line


def test_cli_under_torchrun_prints_what_one_process_prints(tiny_gguf):
    """``torchrun --nproc-per-node 2 -m clearlm generate ... --tensor-parallel 2`` (the real
    launcher) prints exactly the one-process text, once (rank 1 prints nothing); the pipeline
    mode runs the same generation code (its tokens: test_parallel_matches_one_process)."""
    args = ["generate", "hello world", "-m", tiny_gguf, "-n", "12", "--temperature", "0", "-q"]
    env = {k: v for k, v in rank_env(0, 1, 0).items() if k not in DIST_VARS}

    def run(cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)

    one = clearlm.load(tiny_gguf).generate("hello world", 12, temperature=0.0)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    tp = run([*torchrun, "-m", "clearlm", *args, "--tensor-parallel", "2"])
    # the ranks' own output comes first in torchrun's stderr, its summary last: show both
    assert tp.returncode == 0, tp.stderr[:3000] + "\n...\n" + tp.stderr[-1500:]
    assert tp.stdout == one.text + "\n"


def test_torchrun_without_a_parallel_option_is_one_line(tiny_gguf):
    """A rank of a 2-process launch asked for neither mode would run the whole command (and
    print it) once per rank: it ends with one line and exit code 11 before loading."""
    for extra in ([], ["--pipeline-parallel", "1"]):
        gen = clearlm_cmd("generate", "hi", "-m", tiny_gguf, "-n", "2", "-q", *extra)
        done = subprocess.run(gen, env=rank_env(0, 2, free_port()), capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 11 and done.stdout == "", done.stderr
        line = _one_error_line(done.stderr)
        assert line.startswith("error: torchrun started 2 processes but the model is not split")


def test_unreachable_rendezvous_is_one_line(tiny_gguf):
    """Rank 1 of 2 whose rendezvous (127.0.0.1, a port nobody listens on) never answers ends
    with one line and exit code 11 within a few timeouts (c10d retries the connection)."""
    gen = clearlm_cmd("generate", "hi", "-m", tiny_gguf, "--tensor-parallel", "2", "-q")
    start = time.perf_counter()
    done = subprocess.run(
        gen + ["--dist-timeout", "2"],
        env=rank_env(1, 2, free_port()),  # the port was free: closed
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.perf_counter() - start
    assert done.returncode == 11
    line = _one_error_line(done.stderr)
    assert line.startswith("error: rank 1: could not join the other ranks at 127.0.0.1:"), line
    assert elapsed < 90, elapsed  # ~3 timeouts + startup on a busy host


@pytest.mark.parametrize(
    "sizes, message",
    [
        (dict(tensor_parallel=2, pipeline_parallel=2), "use --tensor-parallel or --pipeline-"),
        (dict(tensor_parallel=0), "--tensor-parallel must be an integer ≥ 1, got 0"),
        (dict(pipeline_parallel=True), "--pipeline-parallel must be an integer ≥ 1, got True"),
        (dict(tensor_parallel=2), "--tensor-parallel / --pipeline-parallel need one process"),
    ],
)
def test_bad_parallel_options_are_one_typed_line(tiny_gguf, monkeypatch, sizes, message):
    """Refused before any weight is read or any rank is waited for (no torchrun here)."""
    for var in DIST_VARS:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DistributedError) as e:
        load_placed(open_checkpoint(tiny_gguf), torch.float32, torch.device("cpu"), **sizes)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("sizes", [dict(tensor_parallel="2"), dict(pipeline_parallel=1.5)])
def test_load_refuses_parallel_sizes_of_the_wrong_type(tiny_gguf, sizes):
    """clearlm.load checks the sizes first: a str used to reach max() as a TypeError."""
    (name, value), = sizes.items()
    flag = "--" + name.replace("_", "-")
    with pytest.raises(DistributedError, match=f"^{flag} must be an integer ≥ 1, got {value!r}$"):
        clearlm.load(tiny_gguf, **sizes)


def test_more_ranks_than_heads_or_blocks(tiny_gguf):
    c = open_checkpoint(tiny_gguf).config  # 4 heads, 2 blocks
    with pytest.raises(DistributedError, match="--tensor-parallel 5 is more than the 4 heads"):
        shard_plan(c, 0, 5)
    with pytest.raises(DistributedError, match="--pipeline-parallel 3 is more than the model's 2"):
        stage_plan(c, 0, 3)


def test_world_size_must_match(tiny_gguf, monkeypatch):
    """torchrun started 1 process for --tensor-parallel 2: one line saying what to pass."""
    env = rank_env(0, 1, free_port())
    for var in DIST_VARS:
        monkeypatch.setenv(var, env[var])
    try:
        with pytest.raises(DistributedError) as e:
            ckpt, cpu = open_checkpoint(tiny_gguf), torch.device("cpu")
            load_placed(ckpt, torch.float32, cpu, 2, 1, timeout_s=5.0)
        assert str(e.value) == (
            "--tensor-parallel 2 needs 2 processes, but torchrun started 1; "
            "use --nproc-per-node 2 (times --nnodes)"
        )
    finally:
        launch.shutdown()


def test_pipeline_cache_holds_only_the_ranks_blocks(tiny_gguf):
    """Rank 1 of 2 (block 1 of 2): buffers for block 1 only, empty for block 0."""
    c = open_checkpoint(tiny_gguf).config
    stage = PipelineStage(c)
    stage.setup_stage(1, 2)
    cache = stage.new_cache(2, 16)
    assert cache.keys[0].numel() == cache.values[0].numel() == 0
    assert cache.keys[1].shape[:2] == (2, c.n_kv_heads) and cache.keys[1].shape[-1] == c.head_dim
