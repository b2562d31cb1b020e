"""loading/compact/pack_cache.py: the packed copy a compact load keeps on disk and maps the next
time.

A load from the copy must equal a load that packs (every buffer bit for bit, the fused Q/K/V
and gate/up still views of one buffer, same logits), on tiny files and on SmolLM2; a changed
file, a damaged or foreign copy, or ``CLEARLM_PACK_CACHE=0`` must fall back to packing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from safetensors import safe_open
from test_compact_load import TOKENS, assert_same_model
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import SamplingParamsError
from clearlm.loading.compact import pack_cache
from clearlm.loading.gguf_file import GGUFTensor
from clearlm.quant.pack import Packed, pack_blocks
from clearlm.quant.tiles import tile_rows


def random_packed(qtype: Q, n: int = 4, k: int = 256, seed: int = 0):
    """A Packed (n, k) matrix of random blocks whose float16 scales are all 0.5 (no NaN)."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (n * k // block, size), dtype=np.uint8)
    half = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    for at in ((208,) if qtype == Q.Q6_K else (0, 2)):  # d (and Q4_1's m; Q5_0's qh, Q8_0's q)
        raw[:, at : at + 2] = half
    return pack_blocks(raw.reshape(n, -1), qtype, (n, k))


def fake_tensor(name: str, qtype, n: int = 4, k: int = 256) -> GGUFTensor:
    """A table entry for an (n, k) matrix (what pack_cache checks a copy against)."""
    qtype = Q[qtype] if isinstance(qtype, str) else qtype
    return GGUFTensor(name, qtype, (k, n), n * k, 0, 0, np.zeros(0, np.uint8))


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    """The copy enabled, in a folder of its own (the suite turns it off: conftest.py). Only
    the packed folder moves: a new $CLEARLM_CACHE would build the kernel again (~40 s)."""
    monkeypatch.setenv("CLEARLM_PACK_CACHE", "1")
    folder = tmp_path / "cache" / "packed"
    monkeypatch.setattr(pack_cache, "packed_dir", lambda cache_dir=None: folder)
    return folder


def no_packing(monkeypatch):
    """Make any packing fail: a load that succeeds then read the copy."""
    def refuse(*args, **kwargs):
        raise AssertionError("packed instead of reading the copy")

    monkeypatch.setattr("clearlm.loading.compact.load.pack_group", refuse)


def fresh(path):
    """The same file loaded with the copy off: what packing gives."""
    old = os.environ.get("CLEARLM_PACK_CACHE")
    os.environ["CLEARLM_PACK_CACHE"] = "0"
    try:
        return clearlm.load(path, threads=1)
    finally:
        if old is None:
            os.environ.pop("CLEARLM_PACK_CACHE")
        else:
            os.environ["CLEARLM_PACK_CACHE"] = old


def loads_as_packing_with_warning(path, match: str) -> None:
    """Loading ``path`` warns (a UserWarning matching ``match``) and gives the model that
    packing gives: a copy refused or not kept never changes the weights."""
    with pytest.warns(UserWarning, match=match):
        got = clearlm.load(path, threads=1)
    with torch.inference_mode():
        assert torch.equal(got.transformer(TOKENS), fresh(path).transformer(TOKENS))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1, Q.Q5_0], ids=lambda q: q.name)
def test_second_load_maps_the_copy_and_equals_packing(tmp_path, monkeypatch, cache_on, qtype):
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=qtype, tied=False, seed=3)
    want = clearlm.load(path, threads=1)  # packs, and writes the copy
    (copy,) = cache_on.glob("t-*.safetensors")
    no_packing(monkeypatch)
    got = clearlm.load(path, threads=1)
    assert_same_model(got.transformer, want.transformer)
    attn = got.transformer.layers[0].self_attn
    assert attn.qkv_split  # still fused, and q_proj's codes are rows of the fused buffer
    assert attn.q_proj.codes.untyped_storage().data_ptr() == \
        attn.qkv_proj.codes.untyped_storage().data_ptr()
    with torch.inference_mode():
        assert torch.equal(got.transformer(TOKENS), want.transformer(TOKENS))
    assert got.weight_bytes == want.weight_bytes
    with safe_open(str(copy), framework="pt") as f:  # the library reads our writer's file
        jobs = json.loads(f.metadata()["clearlm.jobs"])
        assert all(f.get_tensor(k).data_ptr() % pack_cache.ALIGN == 0 for j in jobs
                   for k in j["tensors"])


def test_smollm2_from_the_copy_gives_the_same_logits(smollm2_path, monkeypatch, cache_on):
    want = clearlm.load(smollm2_path, threads=2)  # packs, and writes the copy
    no_packing(monkeypatch)
    got = clearlm.load(smollm2_path, threads=2)
    assert_same_model(got.transformer, want.transformer)
    ids = torch.tensor([got.tokenizer.encode("The capital of France is")])
    with torch.inference_mode():
        assert torch.equal(got.transformer(ids), want.transformer(ids))


def test_a_file_rewritten_in_place_is_packed_again_and_the_old_copy_goes(tmp_path, cache_on):
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=1)
    clearlm.load(path, threads=1)
    (first,) = cache_on.glob("t-*.safetensors")
    before = os.stat(path)
    write_tiny_llama(path, matrix_type=Q.Q8_0, seed=2)  # other weights, same name and size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime put back (`touch -r`)
    assert os.stat(path).st_size == before.st_size and os.stat(path).st_ino == before.st_ino
    got = clearlm.load(path, threads=1)
    (second,) = cache_on.glob("t-*.safetensors")
    assert second != first
    with torch.inference_mode():
        assert torch.equal(got.transformer(TOKENS), fresh(path).transformer(TOKENS))


def test_a_damaged_copy_warns_and_packs(tmp_path, monkeypatch, cache_on):
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q4_0, seed=4)
    clearlm.load(path, threads=1)
    (copy,) = cache_on.glob("t-*.safetensors")
    copy.write_bytes(copy.read_bytes()[: copy.stat().st_size // 2])  # cut short
    loads_as_packing_with_warning(path, "packed copy of t.gguf was not used")
    no_packing(monkeypatch)  # the load rewrote a whole copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clearlm.load(path, threads=1)


def test_a_copy_for_other_tensors_is_not_used(tmp_path, cache_on):
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=4)
    pack_cache.write(path, [[fake_tensor("x", Q.Q8_0)]], [[random_packed(Q.Q8_0)]])
    with pytest.warns(UserWarning, match="tensor list differs"):
        clearlm.load(path, threads=1)


def test_a_copy_with_unreadable_jobs_says_so(tmp_path, cache_on):
    """Metadata whose job list lacks its names: a plain reason, not a bare KeyError ('names')."""
    from safetensors.torch import load_file, save_file

    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=4)
    clearlm.load(path, threads=1)
    (copy,) = cache_on.glob("t-*.safetensors")
    save_file(load_file(copy), copy, metadata={"clearlm.jobs": '[{"rows": 1}]'})
    loads_as_packing_with_warning(path, r"was not used \(its tensor list is missing or "
                                  r"unreadable\); packing it")


def test_a_refused_file_leaves_no_copy(tmp_path, cache_on):
    """A file whose FFN tensors do not fit its header (feed_forward_length says 64, the
    tensors hold 128) is refused, and its packed attention matrices are not written to the
    cache first (a breaker found ~96 MB copies of such files left behind)."""
    from gguf import GGUFValueType as T

    from clearlm.errors import InvalidModelFileError

    path = write_tiny_llama(tmp_path / "bad.gguf", matrix_type=Q.Q8_0, tensor_types={
        "ffn_gate": Q.F32, "ffn_up": Q.F32, "ffn_down": Q.F32},
        overrides={"llama.feed_forward_length": (64, T.UINT32)})
    with pytest.raises(InvalidModelFileError, match="has shape"):
        clearlm.load(path, threads=1)
    assert not list(cache_on.glob("*.safetensors"))


def test_off_writes_nothing(tmp_path, monkeypatch, cache_on):
    monkeypatch.setenv("CLEARLM_PACK_CACHE", "off")
    clearlm.load(write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0), threads=1)
    assert not cache_on.exists()


def test_round_trip_of_unshared_jobs_of_mixed_formats(tmp_path, cache_on):
    """A group whose members have different formats (Qwen's Q5_0 Q/K with a Q8_0 V) is kept
    member by member, each with its own bits, block and scale dtype; row tiles (quant/tiles.py:
    a Q/K pair of 16 + 8 rows and a head here) come back tiled."""
    gguf = write_tiny_llama(tmp_path / "m.gguf")
    q, k = tile_rows(random_packed(Q.Q5_0, n=16, seed=1)), tile_rows(random_packed(Q.Q5_0, n=8,
                                                                                   seed=2))
    codes, scale = (torch.cat([getattr(q, f), getattr(k, f)]) for f in ("codes", "scale"))
    nq = q.codes.shape[0]  # Q's tiles: 16 rows in tiles of tile_size's rows (4 or 8)
    lead = [Packed(codes[:nq], scale[:nq], None, 5, 32, "Q5_0"),  # Q and K share buffers, as
            Packed(codes[nq:], scale[nq:], None, 5, 32, "Q5_0")]  # from_file.pack_group packs
    assert lead[0].shape == (16, 32 * scale.shape[1]) and lead[1].shape[0] == 8
    jobs = [[random_packed(Q.Q5_0), random_packed(Q.Q8_0), random_packed(Q.Q6_K)],
            [tile_rows(random_packed(Q.Q4_1, n=8))], [*lead, random_packed(Q.Q8_0, seed=3)]]
    tensors = [[fake_tensor(name, p.qtype, p.shape[0]) for name, p in zip(names, job, strict=True)]
               for names, job in zip(["abc", "d", "qkv"], jobs, strict=True)]
    pack_cache.write(gguf, tensors, jobs)
    back = pack_cache.read(gguf, tensors, [[p.tile for p in job] for job in jobs])
    assert back is not None
    q_back, k_back, v_back = back[2]  # Q and K views of one mapped buffer again, V apart
    assert q_back.codes.untyped_storage().data_ptr() == k_back.codes.untyped_storage().data_ptr()
    assert k_back.codes.storage_offset() == q_back.codes.numel()
    assert v_back.codes.untyped_storage().data_ptr() != q_back.codes.untyped_storage().data_ptr()
    for want_job, got_job in zip(jobs, back, strict=True):
        for want, got in zip(want_job, got_job, strict=True):
            assert (got.bits, got.block, got.qtype) == (want.bits, want.block, want.qtype)
            assert got.tile == want.tile and got.shape == want.shape
            assert torch.equal(got.codes, want.codes) and torch.equal(got.scale, want.scale)
            assert (got.min is None) == (want.min is None)
            assert got.min is None or torch.equal(got.min, want.min)


def test_each_kernel_layout_keeps_its_own_copy(tmp_path, monkeypatch, cache_on):
    """Processes whose kernel builds pack differently (AVX2: tiles of 4 and 5-bit bit fields;
    AVX-512 or no kernel: tiles of 8, ggml's 5-bit blocks) use different copies of one file, and
    writing one leaves the other's: neither rejects and rewrites the other's at every load (a
    breaker's finding). Simulated here by the layout the key reads; the second load of each
    layout reads its copy without a warning."""
    gguf = write_tiny_llama(tmp_path / "m.gguf", matrix_type=Q.Q8_0)
    paths = []
    for tile, fields in ((4, True), (8, False), (4, True)):
        monkeypatch.setattr(pack_cache, "tile_size", lambda bits, block, t=tile: t)
        monkeypatch.setattr(pack_cache, "preferred", lambda f=fields: f)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "was not used" warning
            clearlm.load(gguf, threads=1)
        paths.append(pack_cache.cache_path(gguf))
    assert paths[0] != paths[1] and paths[0] == paths[2]
    assert sorted(cache_on.glob("m-*.safetensors")) == sorted(paths[:2])  # both kept


def test_the_cli_says_a_damaged_copy_in_one_warning_line(tmp_path, cache_on):
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=6)
    env = {**os.environ, "COLUMNS": "200", "CLEARLM_NO_KERNELS": "1",  # no kernel build
           "CLEARLM_CACHE": str(cache_on.parent)}
    # the copy written by a process like the CLI's below (no kernel: its own layout, own copy)
    subprocess.run([sys.executable, "-c", f"import clearlm; clearlm.load({str(path)!r})"],
                   check=True, env=env, timeout=120)
    (copy,) = cache_on.glob("t-*.safetensors")
    copy.write_bytes(b"not a safetensors file")
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "generate", "hi", "-n", "2", "-m", str(path), "-q"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("warning: the packed copy of t.gguf was not used (")
    assert line.endswith("); packing it")


def test_a_cache_that_cannot_be_written_warns_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("CLEARLM_PACK_CACHE", "1")
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setattr(pack_cache, "packed_dir", lambda cache_dir=None: blocked / "packed")
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=7)
    loads_as_packing_with_warning(path, r"could not keep a packed copy of t.gguf .*"
                                  r"CLEARLM_PACK_CACHE=0 stops trying")


def test_a_copy_with_a_tampered_layout_is_not_used(tmp_path, cache_on):
    """A valid safetensors header that says other rows or another format for a tensor (here:
    the first job's member kinds swapped for Q4_1's) would give wrong weights: refused."""
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0, seed=8)
    clearlm.load(path, threads=1)
    (copy,) = cache_on.glob("t-*.safetensors")
    with safe_open(str(copy), framework="pt") as f:
        meta = json.loads(f.metadata()["clearlm.jobs"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta[0]["kinds"] = [[4, 32, "Q4_1"] for _ in meta[0]["kinds"]]
    from safetensors.torch import save_file

    save_file(tensors, str(copy), {"clearlm.jobs": json.dumps(meta)})
    loads_as_packing_with_warning(path, "is not laid out as packing lays it out")


@pytest.mark.parametrize("tiled", [True, False])
def test_a_copy_in_other_row_tiles_than_planned_is_not_used(tmp_path, cache_on, tiled):
    """Rows in tiles of 8 read as row-major (or the reverse) would be other rows' weights: a
    copy whose tiles are not this load's plan is refused, whatever its header says."""
    gguf = write_tiny_llama(tmp_path / "m.gguf")
    packed = random_packed(Q.Q8_0, n=8)
    job = [tile_rows(packed) if tiled else packed]
    tensors = [[fake_tensor("w", Q.Q8_0, 8)]]
    pack_cache.write(gguf, tensors, [job])
    assert pack_cache.read(gguf, tensors, [[job[0].tile]]) is not None
    with pytest.warns(UserWarning, match="w is not laid out as packing lays it out"):
        assert pack_cache.read(gguf, tensors, [[1 if tiled else 8]]) is None


def test_two_files_of_one_name_keep_a_copy_each(tmp_path, monkeypatch, cache_on):
    for d in ("d1", "d2"):
        (tmp_path / d).mkdir()
    one = write_tiny_llama(tmp_path / "d1" / "m.gguf", seed=1, matrix_type=Q.Q8_0)
    two = write_tiny_llama(tmp_path / "d2" / "m.gguf", seed=2, matrix_type=Q.Q8_0)
    clearlm.load(one, threads=1)
    clearlm.load(two, threads=1)
    assert len(list(cache_on.glob("m-*.safetensors"))) == 2
    no_packing(monkeypatch)  # both now load from their copies
    clearlm.load(one, threads=1)
    clearlm.load(two, threads=1)


def test_writing_a_copy_sweeps_what_no_load_will_use(tmp_path, cache_on):
    """Copies of files that are gone, and the .tmp of a writer that was killed, go when the next
    copy is written; a running writer's .tmp stays."""
    gone = write_tiny_llama(tmp_path / "gone.gguf", matrix_type=Q.Q8_0, seed=1)
    clearlm.load(gone, threads=1)
    (old_copy,) = cache_on.glob("gone-*.safetensors")
    gone.unlink()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    killed = cache_on / f"x-0123456789abcdef.safetensors.{dead}.tmp"
    running = cache_on / f"x-0123456789abcdef.safetensors.{os.getpid()}.tmp"
    killed.write_bytes(b"partial")
    running.write_bytes(b"partial")
    clearlm.load(write_tiny_llama(tmp_path / "new.gguf", matrix_type=Q.Q8_0), threads=1)
    assert not old_copy.exists() and not killed.exists() and running.exists()
    assert len(list(cache_on.glob("new-*.safetensors"))) == 1


@pytest.mark.parametrize("value", ["banana", "2", "disabled"])
def test_an_unknown_setting_is_refused_in_one_line(tmp_path, monkeypatch, value):
    monkeypatch.setenv("CLEARLM_PACK_CACHE", value)
    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q8_0)
    with pytest.raises(SamplingParamsError, match=f"CLEARLM_PACK_CACHE must be 1/on/yes/true "
                                                  f"or 0/off/no/false, got '{value}'"):
        clearlm.load(path, threads=1)
