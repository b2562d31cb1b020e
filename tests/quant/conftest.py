"""Fixtures shared by the compact-weight tests."""

from __future__ import annotations

import pytest

from clearlm.quant import linear as qlinear
from clearlm.quant.kernels import load_kernels


@pytest.fixture(params=["kernel", "torch"])
def path_kind(request, monkeypatch) -> str:
    """Each QuantLinear product twice: through the C++ kernel ("kernel"; skipped without a
    compiler) and through the pure-torch fallback ("torch", the kernel hidden)."""
    if request.param == "kernel" and load_kernels() is None:
        pytest.skip("no C++ compiler: kernel path unavailable")
    if request.param == "torch":
        monkeypatch.setattr(qlinear, "load_kernels", lambda: None)
    return request.param
