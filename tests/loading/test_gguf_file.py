"""loading/gguf_file.py reads what gguf.GGUFReader reads: every key and value (every token, score,
type and merge), every tensor's name, type, shape, offset and bytes, on the tiny test GGUFs and
the real files. Reference: the ``gguf`` package's own reader (llama.cpp's gguf-py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from tiny_gguf import write_tiny_llama

from clearlm.errors import InvalidModelFileError
from clearlm.loading.gguf import open_gguf
from clearlm.loading.gguf_file import GGUFFile

CACHE = Path.home() / ".cache" / "clearlm"
# Gemma 3's file (262k tokens) is left out: GGUFReader takes ~20 s on it, and the real-model
# parity tests read every Gemma tensor through GGUFFile against transformers.
REAL = [CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]


def reference_value(field) -> object:
    """A GGUFReader field as plain Python: strings decoded, arrays as lists."""
    types = field.types
    if types[0] == GGUFValueType.ARRAY:
        if types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]


def assert_same_as_reader(path: Path) -> None:
    ref, got = GGUFReader(path), GGUFFile(path)
    want = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(got.metadata) == list(want)  # same keys, same order
    for key, field in want.items():
        value = got.metadata[key]
        assert value == reference_value(field), key
        assert type(value) is type(reference_value(field)), key
        assert got.value_types[key] == field.types[0], key
    assert got.data_offset == ref.data_offset
    assert len(got.tensors) == len(ref.tensors)
    for t, r in zip(got.tensors, ref.tensors, strict=True):
        assert (t.name, t.tensor_type, t.n_elements, t.n_bytes, t.data_offset) == (
            r.name, r.tensor_type, r.n_elements, r.n_bytes, r.data_offset
        )  # fmt: skip
        assert t.shape == tuple(int(d) for d in r.shape)
        assert t.data.dtype == r.data.dtype and t.data.shape == r.data.shape, t.name
        assert np.array_equal(t.data.view(np.uint8), np.asarray(r.data).view(np.uint8)), t.name


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_1, Q.Q5_0], ids=lambda q: q.name)
def test_tiny_files_read_as_gguf_reader(tmp_path, qtype: Q) -> None:
    assert_same_as_reader(write_tiny_llama(tmp_path / "t.gguf", matrix_type=qtype, tied=False))


def test_every_value_type_and_alignment(tmp_path) -> None:
    """Scalars of every type, arrays of numbers, bools and strings, invalid UTF-8 in an array,
    and a non-default alignment."""
    path = tmp_path / "kinds.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_uint8("k.u8", 200)
    w.add_int8("k.i8", -5)
    w.add_uint16("k.u16", 60000)
    w.add_int16("k.i16", -30000)
    w.add_int32("k.i32", -(2**31))
    w.add_float32("k.f32", 0.1)
    w.add_uint64("k.u64", 2**64 - 1)
    w.add_int64("k.i64", -(2**63))
    w.add_float64("k.f64", 1e300)
    w.add_bool("k.bool", True)
    w.add_string("k.str", "héllo ▁ 世界")
    w.add_array("k.floats", [0.5, -1.25, 3.0])
    w.add_array("k.bools", [True, False])
    w.add_array("k.strs", ["a", "", "ü", "<|im_end|>"])
    w.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    w.add_tensor("b", np.arange(4, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_reader(path)
    got = GGUFFile(path)
    assert got.metadata["k.f32"] == float(np.float32(0.1)) and got.metadata["k.bool"] is True
    assert got.data_offset % 64 == 0


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name.split("-")[0])
def test_real_files_read_as_gguf_reader(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path.name} not pulled")
    assert_same_as_reader(path)


def test_smollm2_reads_as_gguf_reader(smollm2_path: Path) -> None:
    assert_same_as_reader(smollm2_path)


def test_bad_bytes_are_one_typed_error(tmp_path) -> None:
    tiny = write_tiny_llama(tmp_path / "t.gguf")
    data = tiny.read_bytes()
    for name, cut in [("header", data[:3000]), ("data", data[:-1000]), ("magic", data[:20])]:
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(cut)
        with pytest.raises(InvalidModelFileError, match="truncated or corrupt"):
            open_gguf(bad)
    # the header's message names the file's size, not struct's buffer offsets
    with pytest.raises(InvalidModelFileError) as e:
        open_gguf(tmp_path / "header.gguf")
    assert "its header ends early: the file has 3,000 bytes" in str(e.value)
    assert "unpack" not in str(e.value) and "GGUFFormatError" not in str(e.value)
    wrong_version = tmp_path / "v9.gguf"
    wrong_version.write_bytes(b"GGUF" + (9).to_bytes(4, "little") + data[8:])
    with pytest.raises(InvalidModelFileError, match="version 9"):
        open_gguf(wrong_version)


def test_tensors_that_share_bytes_are_refused(tmp_path) -> None:
    """A tensor's type id changed from Q4_0 to Q8_0 in the table (a breaker's edit): its data
    now runs into the next tensor's. Refused as a corrupt file, where it loaded and ended in
    NaN logits (or, with finite bytes, would have produced text from the wrong numbers)."""
    from gguf import GGMLQuantizationType as Q

    path = write_tiny_llama(tmp_path / "t.gguf", matrix_type=Q.Q4_0)
    open_gguf(path)  # the file as written is fine
    data = bytearray(path.read_bytes())
    name = b"blk.0.attn_q.weight"
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    n_dims = int.from_bytes(data[at : at + 4], "little")
    type_at = at + 4 + 8 * n_dims
    assert int.from_bytes(data[type_at : type_at + 4], "little") == Q.Q4_0
    data[type_at : type_at + 4] = int(Q.Q8_0).to_bytes(4, "little")
    bad = tmp_path / "overlap.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(InvalidModelFileError, match="blk.0.attn_q.weight and .* overlap"):
        open_gguf(bad)

