"""SentencePiece-style GGUF vocabularies (``tokenizer.ggml.model == "llama"``: tokens + scores,
no merges) against transformers reading the same file: Gemma 3 270M (262,144 tokens, BOS added),
and Llama / Phi-3 style pipelines on a slice of Gemma's vocabulary.

Reference quirks (transformers 5, integrations/gguf/gguf_tokenizer_mapping.py):
- Gemma's merges are ranked by position in the file, not by score; tokens of 2-31 spaces are
  stored as real spaces and respelled '▁▁…', so they are not added tokens (while '\\n\\n' and
  '\\t\\t' are: USER_DEFINED tokens spelled like the vocabulary).
- For other architectures ``tokenizer.ggml.add_space_prefix`` is ignored ('▁' always prepended);
  clearlm follows it, so the comparison here uses files where it is true or absent.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from real_parity import hf_gguf_tokenizer
from test_tokenizer import (
    PLAIN,
    STREAM,
    assert_stream_equals_decode,
    gguf_metadata,
    model_path,
)

from clearlm.tokenizer import StreamingDetokenizer, Tokenizer, tokenizer_from_gguf
from clearlm.tokenizer.gguf_vocab import merges_from_scores

GEMMA_TEXTS = [
    *PLAIN,
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>already has a BOS<eos>",
    "<table><tr><td>cell</td></tr></table> <h1>Title</h1>",
    "tabs\t\tand\n\n\nnewlines\t",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ⺁ \U0010fffd (byte fallback)",
    "<unk> <mask> <unused0> [multimodal]",
    "▁literal lower-eighth blocks▁▁",
    "x" * 40 + " " + "ab" * 25,
]


@pytest.fixture(scope="module")
def gemma_path() -> Path:
    return model_path("gemma3-270m")


@pytest.fixture(scope="module")
def gemma_metadata(gemma_path: Path) -> dict[str, Any]:
    return gguf_metadata(gemma_path)


@pytest.fixture(scope="module")
def gemma(gemma_metadata: dict[str, Any], gemma_path: Path) -> Tokenizer:
    return tokenizer_from_gguf(gemma_metadata, gemma_path.name)


@pytest.fixture(scope="module")
def hf_gemma(gemma_path: Path):
    return hf_gguf_tokenizer(gemma_path)


def _byte_id(tok: Tokenizer, b: int) -> int:
    return tok.backend.token_to_id(f"<0x{b:02X}>")


def test_gemma_ids_match_reference(gemma: Tokenizer, hf_gemma) -> None:
    assert len(GEMMA_TEXTS) >= 20
    for text in GEMMA_TEXTS:
        ids = gemma.encode(text)
        assert ids == hf_gemma.encode(text), text
        body = gemma.encode(text, add_special_tokens=False)
        assert body == hf_gemma.encode(text, add_special_tokens=False), text
        assert ids == [2, *body]  # BOS once
        # SentencePiece writes spaces as '▁', so a literal '▁' comes back as a space (in both)
        assert gemma.decode(body) == text.replace("▁", " ")
        for skip in (False, True):
            assert gemma.decode(ids, skip) == hf_gemma.decode(ids, skip_special_tokens=skip)


def test_gemma_facts(gemma: Tokenizer, gemma_metadata: dict[str, Any]) -> None:
    assert (gemma.vocab_size, gemma.bos_id, gemma.eos_id) == (262144, 2, 1)
    assert gemma.add_bos and not gemma.add_eos
    assert gemma.encode("") == [2]
    assert gemma.eos_ids == frozenset({1, 106})  # <end_of_turn> by llama.cpp's text rule
    assert gemma.encode("<start_of_turn>", add_special_tokens=False) == [105]
    assert gemma.id_to_token(138) == "  "  # as the file spells it
    assert gemma.encode("a  b", add_special_tokens=False) == gemma.encode("a▁▁b", False)
    assert gemma.token_bytes(gemma.encode(" the", False)[0]) == b" the"
    assert gemma.token_bytes(_byte_id(gemma, 0xE4)) == b"\xe4"
    assert 106 in gemma.special_ids and 107 not in gemma.special_ids  # '\n' is USER_DEFINED
    assert gemma.special_tokens["bos_token"] == "<bos>"
    assert gemma.chat_template is None  # the base model's GGUF has none
    assert "tokenizer.chat_template" not in gemma_metadata


def test_gemma_streaming(gemma: Tokenizer) -> None:
    for text in [*STREAM, "𝔘𝔫𝔦 ⺁ ok"]:
        chunks = assert_stream_equals_decode(gemma, gemma.encode(text))
        assert all("\ufffd" not in c for c in chunks)
    # '𝔘' has no token: four byte tokens, held until the run ends.
    ids = gemma.encode("𝔘", add_special_tokens=False)
    assert ids == [_byte_id(gemma, b) for b in "𝔘".encode()]
    stream = StreamingDetokenizer(gemma)
    assert [stream.add(i) for i in ids] == ["", "", "", ""]
    assert stream.add(gemma.encode("!", False)[0]) == "𝔘!"


def test_gemma_invalid_byte_runs_as_reference(gemma: Tokenizer, hf_gemma) -> None:
    """`tokenizers`' ByteFallback: an invalid run is U+FFFD per byte, valid bytes included."""
    e4, b8, ad, ff = (_byte_id(gemma, b) for b in (0xE4, 0xB8, 0xAD, 0xFF))
    (a,) = gemma.encode("a", add_special_tokens=False)
    for ids, text in [
        ([e4, b8, ad], "中"),
        ([e4, b8, ad, ff, a], "\ufffd" * 4 + "a"),
        ([a, e4, a, e4, b8, ad], "a\ufffda中"),
    ]:
        assert gemma.decode(ids) == hf_gemma.decode(ids) == text
        assert_stream_equals_decode(gemma, ids)
    stream = StreamingDetokenizer(gemma)
    assert [stream.add(i) for i in (e4, b8)] == ["", ""]
    assert stream.flush() == "\ufffd\ufffd"  # a run cut short is not held forever


def test_gemma_streaming_random_ids(gemma: Tokenizer) -> None:
    rng = random.Random(0)
    byte_ids = [_byte_id(gemma, b) for b in range(256)]
    spaces = list(range(138, 168))
    for _ in range(300):
        ids = [
            rng.choice(byte_ids)
            if (r := rng.random()) < 0.5
            else rng.choice(spaces)
            if r < 0.6
            else rng.randrange(gemma.vocab_size)
            for _ in range(rng.randrange(1, 12))
        ]
        assert_stream_equals_decode(gemma, ids)


def test_gemma_merges_as_transformers(gemma_metadata: dict[str, Any]) -> None:
    from transformers.tokenization_utils_base import generate_merges

    tokens = gemma_metadata["tokenizer.ggml.tokens"][:30000]
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = dict(zip(tokens, gemma_metadata["tokenizer.ggml.scores"][:30000], strict=True))
    assert merges_from_scores(vocab, scores) == generate_merges(vocab, scores)


def test_merges_with_tied_scores_as_transformers(gemma_metadata: dict[str, Any]) -> None:
    """Scores rounded to a few values: cuts of different tokens tie and interleave by length."""
    from transformers.tokenization_utils_base import generate_merges

    tokens = gemma_metadata["tokenizer.ggml.tokens"][:20000]
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = {t: float(random.Random(i).randrange(4)) for i, t in enumerate(tokens)}
    assert merges_from_scores(vocab, scores) == generate_merges(vocab, scores)


# --- other SentencePiece architectures, on the first 30,000 Gemma tokens and '▁' ------------


def _slice(metadata: dict[str, Any], arch: str, n: int = 30000) -> dict[str, Any]:
    out = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}
    space = metadata["tokenizer.ggml.tokens"].index("▁")  # far down Gemma's list: keep it
    for key in ("tokens", "scores", "token_type"):
        values = metadata[f"tokenizer.ggml.{key}"]
        out[f"tokenizer.ggml.{key}"] = [*values[:n], values[space]]
    out.pop("tokenizer.ggml.add_space_prefix")  # Gemma's is false; others default to true
    return {**out, "general.architecture": arch}


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_other_architectures_match_transformers(gemma_metadata: dict[str, Any], arch) -> None:
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    meta = _slice(gemma_metadata, arch)
    keys = GGUF_TOKENIZER_MAPPING["tokenizer"].items()
    fields = {name: meta[f"tokenizer.{k}"] for k, name in keys if f"tokenizer.{k}" in meta}
    ref, _ = convert_gguf_tokenizer(arch, fields)
    ours = tokenizer_from_gguf(meta, f"{arch}.gguf")
    texts = [*GEMMA_TEXTS, "  two leading spaces", "<bos> after a special"]
    for text in texts:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False), text
        assert_stream_equals_decode(ours, ids)
    assert ours.add_bos and ours.encode("hi")[0] == 2  # llama.cpp's default for SentencePiece
    rng = random.Random(2)
    for _ in range(100):
        ids = [rng.randrange(600) for _ in range(rng.randrange(1, 8))]  # specials, bytes, '▁x'
        assert_stream_equals_decode(ours, ids)


def test_add_space_prefix_false_is_followed(gemma_metadata: dict[str, Any]) -> None:
    """llama.cpp puts no '▁' in front when the file says so (transformers always does)."""
    with_prefix = tokenizer_from_gguf(_slice(gemma_metadata, "llama"))
    meta = {**_slice(gemma_metadata, "llama"), "tokenizer.ggml.add_space_prefix": False}
    without = tokenizer_from_gguf(meta)
    first = with_prefix.encode("hello world", add_special_tokens=False)[0]
    assert with_prefix.id_to_token(first).startswith("▁")
    first = without.encode("hello world", add_special_tokens=False)[0]
    assert not without.id_to_token(first).startswith("▁")
    for tok in (with_prefix, without):
        for text in ("hello world", " hi", "  two"):
            ids = tok.encode(text, add_special_tokens=False)
            # Metaspace adds no '▁' to a text that starts with one, but the decoder strips one:
            # a text starting with spaces loses one (as in transformers' LlamaTokenizer).
            lost = tok is with_prefix and text.startswith(" ")
            assert tok.decode(ids) == (text[1:] if lost else text)
            assert_stream_equals_decode(tok, ids)
