"""bench/bandwidth.py's bytes per token on tiny Q8_0 GGUFs (no llama.cpp needed): what the file
says llama.cpp reads equals what clearlm's compact load holds and reads (Q8_0 blocks are kept
as stored), for a tied and an untied embedding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from tiny_gguf import write_tiny_llama

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bandwidth import clearlm_bytes, file_bytes  # noqa: E402


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_bytes_per_token_from_the_file_and_the_model(tmp_path, tied):
    path = write_tiny_llama(tmp_path / "t.gguf", tied=tied, matrix_type=GGMLQuantizationType.Q8_0)
    got = file_bytes(path)
    assert got == clearlm_bytes(path)
    if not tied:  # the untied embedding gives one row: less than the whole file
        from clearlm.loading.gguf_file import GGUFFile

        assert got < sum(int(t.n_bytes) for t in GGUFFile(path).tensors)
