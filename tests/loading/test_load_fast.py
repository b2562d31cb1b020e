"""Load time: `clearlm generate` on a compact GGUF imports only what generating needs.

torch._dynamo alone costs ~0.7 s of CPU time at start (``python -X importtime``); transformers,
the server and the web UI pieces even more. They stay out of a plain generate run: the module
list is read from the very process that ran the command."""

from __future__ import annotations

import json
import subprocess
import sys

from gguf import GGMLQuantizationType as Q
from tiny_gguf import write_tiny_llama

# imported only by the paths that need them: torch.compile, the reference, the server/UI,
# the chat template (jinja2)
NOT_AT_RUN_TIME = (
    "torch._dynamo", "transformers", "fastapi", "uvicorn", "matplotlib", "sympy",
    "torch.utils.cpp_extension", "setuptools", "jinja2",
)  # fmt: skip

RUN = """
import json, runpy, sys
sys.argv = ["clearlm", "generate", "-m", sys.argv[1], "Hi", "-n", "2", "-q"]
try:
    runpy.run_module("clearlm", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def test_generate_imports_only_what_it_needs(tmp_path):
    path = write_tiny_llama(tmp_path / "q.gguf", matrix_type=Q.Q8_0)  # compact: quant/ops runs
    done = subprocess.run([sys.executable, "-c", RUN, str(path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert "clearlm.quant.ops" in loaded  # the compact path really ran
    assert sorted(m for m in NOT_AT_RUN_TIME if m in loaded) == []


# ---- the byte-level vocabulary and merges, built in bulk (tokenizer/gguf_vocab.py) ----


def test_byte_level_vocab_fast_path_and_respelling():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from clearlm.tokenizer.gguf_vocab import CONTROL, NORMAL, _byte_level_vocab

    to_char = bytes_to_unicode()  # GPT-2's byte → character table (the reference)
    plain = ["a", "Ġb", "a", "<|x|>"]  # all in the alphabet; "a" twice: the first id wins
    assert _byte_level_vocab(plain, [NORMAL] * 3 + [CONTROL]) == {"a": 0, "Ġb": 1, "<|x|>": 3}
    odd = ["a", "日本", "日本", "a"]  # a NORMAL token outside the alphabet is respelled
    got = _byte_level_vocab(odd, [NORMAL, NORMAL, CONTROL, NORMAL])
    respelled = "".join(to_char[b] for b in "日本".encode())
    assert got == {"a": 0, respelled: 1, "日本": 2}


def test_bad_merge_is_named(tmp_path):
    from clearlm.errors import InvalidModelFileError
    from clearlm.loading.checkpoint import GGUFCheckpoint
    from clearlm.tokenizer import tokenizer_from_gguf

    meta = dict(GGUFCheckpoint(write_tiny_llama(tmp_path / "t.gguf")).metadata)
    ids = [meta["tokenizer.ggml.tokens"].index(t) for t in ("he", "ll", "o")]
    assert tokenizer_from_gguf(meta).encode("hello") == ids  # the good merges apply
    for bad in ("h zz", "zz h", "h l"):  # a part, or the merged token ("hl"), not in the vocab
        meta["tokenizer.ggml.merges"] = ["h e", bad, "l l"]
        try:
            tokenizer_from_gguf(meta, "t.gguf")
        except InvalidModelFileError as e:
            assert str(e) == f"t.gguf: BPE merge {bad!r} leaves the vocabulary"
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_loaded_model_drops_the_vocabulary_arrays(tmp_path):
    """The Model keeps the file's metadata less the per-token arrays its tokenizer was built
    from (memory), and the tokenizer still gives every token the file lists."""
    import clearlm
    from clearlm.loading.checkpoint import GGUFCheckpoint
    from clearlm.tokenizer.gguf import VOCAB_ARRAYS

    path = write_tiny_llama(tmp_path / "t.gguf")
    full = GGUFCheckpoint(path).metadata
    model = clearlm.load(path)
    assert not set(VOCAB_ARRAYS) & set(model.metadata)
    assert set(full) - set(model.metadata) == set(VOCAB_ARRAYS) & set(full)
    assert "tokenizer.ggml.tokens" in full and "tokenizer.ggml.merges" in full
    assert [model.tokenizer.id_to_token(i) for i in range(model.tokenizer.vocab_size)] == list(
        full["tokenizer.ggml.tokens"]
    )
    assert model.metadata["general.architecture"] == full["general.architecture"]
