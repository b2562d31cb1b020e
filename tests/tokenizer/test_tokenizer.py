"""Byte-level BPE ("gpt2") GGUF tokenizers against transformers reading the same file: SmolLM2
(the `hf_smollm2_tokenizer` fixture) and Qwen2.5-Coder-0.5B (pre-tokenizer qwen2, a long chat
template with tools). Also the shared reference loaders the other tokenizer tests import.

Reference quirk: transformers' GGUF loader ignores ``tokenizer.ggml.pre = "smollm"`` and splits
with plain GPT-2 regex, while SmolLM2's own tokenizer.json and llama.cpp first isolate every
digit (Digits(individual_digits=True) → ByteLevel). The two differ only where whitespace runs
or newlines precede a digit ("a   1"); there we compare with SmolLM2's own pipeline instead.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pytest
from real_parity import hf_gguf_tokenizer
from tokenizers import Tokenizer as HFBackend
from tokenizers import pre_tokenizers

from clearlm.errors import (
    ClearLMError,
    InvalidModelFileError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from clearlm.loading.gguf import open_gguf, read_metadata
from clearlm.store.catalog import resolve_model
from clearlm.tokenizer import (
    ChatTemplateError,
    StreamingDetokenizer,
    Tokenizer,
    _bytes_to_unicode,
    tokenizer_from_gguf,
)

AGREE = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "class A:\n\tdef f(self):\n\t\tpass\n",
    "if x:\n        y = [a, b]  # comment\n",
    "12345",
    "3.14159",
    "1,000,000",
    "a   b",
    "\n\n\n",
    "trailing spaces   ",
    "   leading spaces",
    " one leading space",
    "中文分词测试：你好，世界！",
    "日本語のテキストとカタカナ",
    "한국어 텍스트입니다",
    "Emoji 😀👍🏽 and ❤️",
    "Family 👨‍👩‍👧‍👦 ZWJ",
    "Flags 🇫🇷🇯🇵",
    "Café naïve résumé façade Ångström",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\n",
    "",
    "Mixed: x=42; y = 'héllo' 🙂 中文\tTab",
    "I'm sure they'll say it's fine, DON'T you think?",
    "Dates 2024-11-29 at 10:30",
    "x<|im_end|>y<|endoftext|>",
    "\r\nWindows\r\nlines",
    "Ünïcödé — dashes … quotes “”",
]

# Whitespace runs / newlines before digits: the reference disagrees with SmolLM2 itself here.
DIVERGE = ["a   1", "\n\n1", "  7 8", "x = [\n    1,\n    2]", "\t\t42"]

STREAM = [
    "中文分词测试：你好，世界！",
    "日本語のテキスト",
    "😀👍🏽❤️ 👨‍👩‍👧‍👦 🇫🇷🇯🇵",
    "naïve café 🦜🫠 done",
    "Ελληνικά Русский 𝔘𝔫𝔦",
]

# The strings every real tokenizer is compared on (each file adds its model's special tokens).
PLAIN = [t for t in AGREE if "<|" not in t] + DIVERGE


def model_path(alias: str) -> Path:
    """The GGUF of a model alias (`clearlm pull` puts it in the cache); skip if it is absent."""
    try:
        path = resolve_model(alias)
    except ModelNotFoundError as e:
        pytest.skip(f"{alias} not available ({e})")
    if not path.is_file():
        pytest.skip(f"{alias} not available ({path} is missing; run: clearlm pull {alias})")
    return path


@functools.cache
def gguf_metadata(path: Path) -> dict[str, Any]:
    """The file's metadata, read once per session (opening a 262k-token GGUF takes ~30 s)."""
    return read_metadata(open_gguf(path))


def assert_stream_equals_decode(tok: Tokenizer, ids: list[int]) -> list[str]:
    """Streamed chunks (with and without skipping specials) join to ``decode``; returns the
    chunks of the unskipped stream."""
    for skip in (True, False):
        stream = StreamingDetokenizer(tok, skip_special_tokens=skip)
        chunks = [stream.add(i) for i in ids]
        assert "".join(chunks) + stream.flush() == tok.decode(ids, skip_special_tokens=skip), ids
    return chunks


USER_ONLY = [{"role": "user", "content": "What is 2+2?"}]
FULL_CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!"},
    {"role": "assistant", "content": "Hello. 你好"},
    {"role": "user", "content": "Name a prime."},
]


@pytest.fixture(scope="module")
def metadata(smollm2_path: Path) -> dict[str, Any]:
    return read_metadata(open_gguf(smollm2_path))


@pytest.fixture(scope="module")
def tok(metadata: dict[str, Any], smollm2_path: Path) -> Tokenizer:
    return tokenizer_from_gguf(metadata, smollm2_path.name)


@pytest.fixture(scope="module")
def smollm2_own(hf_smollm2_tokenizer) -> HFBackend:
    """SmolLM2's tokenizer.json pipeline: the reference's vocab with Digits → ByteLevel."""
    backend = HFBackend.from_str(hf_smollm2_tokenizer.backend_tokenizer.to_str())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return backend


def _with(metadata: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of the metadata with ``a__b`` keys meaning ``a.b``; None deletes the key."""
    out = dict(metadata)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("text", AGREE)
def test_ids_match_reference(tok: Tokenizer, hf_smollm2_tokenizer, text: str) -> None:
    assert tok.encode(text) == hf_smollm2_tokenizer.encode(text)
    assert tok.encode(text, add_special_tokens=False) == hf_smollm2_tokenizer.encode(
        text, add_special_tokens=False
    )
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text", DIVERGE)
def test_digits_split_like_smollm2(tok: Tokenizer, smollm2_own: HFBackend, text: str) -> None:
    assert tok.encode(text) == smollm2_own.encode(text).ids
    assert tok.decode(tok.encode(text)) == text


def test_smollm2_facts(tok: Tokenizer) -> None:
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (49152, 1, 2)
    assert not tok.add_bos and not tok.add_eos
    assert tok.encode("hi")[0] != tok.bos_id
    assert tok.eos_ids == frozenset({0, 2})  # llama.cpp ends generation on <|endoftext|> too
    assert tok.encode("<|im_start|>") == [1]
    assert tok.id_to_token(1) == "<|im_start|>"
    assert tok.id_to_token(tok.encode(" hello")[0]) == "Ġhello"
    assert tok.token_bytes(tok.encode(" hello")[0]) == b" hello"
    assert tok.decode([1, *tok.encode("hi"), 2], skip_special_tokens=True) == "hi"


def test_bos_eos_flags(metadata: dict[str, Any]) -> None:
    t = tokenizer_from_gguf(
        _with(metadata, tokenizer__ggml__add_bos_token=True, tokenizer__ggml__add_eos_token=True)
    )
    body = t.encode("hi", add_special_tokens=False)
    assert t.encode("hi") == [1, *body, 2]
    assert t.add_bos and t.add_eos and t.decode(t.encode("hi"), skip_special_tokens=True) == "hi"
    t = tokenizer_from_gguf(_with(metadata, tokenizer__ggml__eot_token_id=5))
    assert t.eos_ids == frozenset({0, 2, 5})


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt-2", "gpt2", "default"])
def test_other_pre_tokenizers_match_transformers(metadata: dict[str, Any], pre: str) -> None:
    """Each table entry against transformers' GGUF builder, on SmolLM2's vocabulary."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    meta = _with(metadata, tokenizer__ggml__pre=pre)
    keys = GGUF_TOKENIZER_MAPPING["tokenizer"].items()
    fields = {name: meta[f"tokenizer.{k}"] for k, name in keys if f"tokenizer.{k}" in meta}
    ref, _ = convert_gguf_tokenizer("llama", fields)
    ref.model.ignore_merges = pre == "llama-bpe"  # as llama.cpp and Llama 3's tokenizer.json
    ours = tokenizer_from_gguf(meta)
    for text in AGREE + DIVERGE + ["I'M here, YOU'LL see 123456 1234567"]:
        assert ours.encode(text) == ref.encode(text).ids, text


@pytest.mark.parametrize("text", STREAM)
def test_streaming_never_splits_a_character(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    stream = StreamingDetokenizer(tok)
    chunks = [stream.add(i) for i in ids]
    assert all("\ufffd" not in c for c in chunks)
    assert "" in chunks  # some token ended mid-character and was held back
    assert "".join(chunks) + stream.flush() == tok.decode(ids) == text


def test_streaming_invalid_bytes_become_replacement(tok: Tokenizer) -> None:
    (a,) = tok.encode("a")
    vocab = {tok.id_to_token(i): i for i in range(tok.vocab_size)}
    lead = vocab[_bytes_to_unicode()[0xE4]]  # first byte of a 3-byte character
    stream = StreamingDetokenizer(tok)
    assert stream.add(lead) == ""  # could still complete
    assert stream.flush() == "\ufffd"  # never completed: not held forever
    assert stream.add(lead) == ""
    assert stream.add(a) == "\ufffda"  # 'a' cannot continue it: emitted at once
    assert tok.decode([lead, lead, a]) == "\ufffd\ufffda"


def test_streaming_equals_decode_on_random_ids(tok: Tokenizer) -> None:
    alphabet = _bytes_to_unicode()
    vocab = {tok.id_to_token(i): i for i in range(tok.vocab_size)}
    byte_ids = [vocab[c] for c in alphabet.values() if c in vocab]
    rng = random.Random(0)
    for _ in range(300):
        ids = [
            rng.choice(byte_ids) if rng.random() < 0.7 else rng.randrange(tok.vocab_size)
            for _ in range(rng.randrange(1, 12))
        ]
        for skip in (False, True):
            stream = StreamingDetokenizer(tok, skip_special_tokens=skip)
            text = "".join(stream.add(i) for i in ids) + stream.flush()
            assert text == tok.decode(ids, skip_special_tokens=skip), ids


@pytest.mark.parametrize("messages", [USER_ONLY, FULL_CHAT])
def test_chat_template_matches_reference(tok: Tokenizer, hf_smollm2_tokenizer, messages) -> None:
    expected = hf_smollm2_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert tok.apply_chat_template(messages) == expected
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == expected.removesuffix(
        "<|im_start|>assistant\n"
    )


def test_chat_environment_matches_reference(metadata: dict[str, Any], hf_smollm2_tokenizer) -> None:
    """tojson, loop controls, {% generation %}, bos_token, whitespace trimming as transformers."""
    template = (
        "{{ bos_token }}{% for m in messages %}\n"
        "  {% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}\n"
        "  {% else %}{{ m | tojson }}{% endif %}\n"
        "  {% if loop.index == 3 %}{% break %}{% endif %}\n"
        "{% endfor %}{{ eos_token }}"
    )
    t = tokenizer_from_gguf(_with(metadata, tokenizer__chat_template=template))
    expected = hf_smollm2_tokenizer.apply_chat_template(
        FULL_CHAT, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    assert t.apply_chat_template(FULL_CHAT) == expected


def test_chat_template_errors(metadata: dict[str, Any]) -> None:
    t = tokenizer_from_gguf(_with(metadata, tokenizer__chat_template=None), "m.gguf")
    with pytest.raises(ChatTemplateError, match="m.gguf has no chat template"):
        t.apply_chat_template(USER_ONLY)
    refuse = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    t = tokenizer_from_gguf(_with(metadata, tokenizer__chat_template=refuse))
    with pytest.raises(ChatTemplateError, match="system first"):
        t.apply_chat_template(USER_ONLY)
    t = tokenizer_from_gguf(_with(metadata, tokenizer__chat_template="{% for %}"))
    with pytest.raises(ClearLMError, match="TemplateSyntaxError"):
        t.apply_chat_template(USER_ONLY)


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"tokenizer__ggml__model": "t5"}, UnsupportedModelError, "tokenizer model 't5'"),
        ({"tokenizer__ggml__model": "bert"}, UnsupportedModelError, "supported: gpt2, llama"),
        ({"tokenizer__ggml__model": "llama"}, InvalidModelFileError, "'tokenizer.ggml.scores'"),
        (
            {"tokenizer__ggml__pre": "falcon"},
            UnsupportedModelError,
            "pre-tokenizer 'falcon'.*smollm",
        ),
        ({"tokenizer__ggml__tokens": None}, InvalidModelFileError, "'tokenizer.ggml.tokens'"),
        ({"tokenizer__ggml__merges": None}, InvalidModelFileError, "'tokenizer.ggml.merges'"),
        ({"tokenizer__ggml__model": None}, InvalidModelFileError, "'tokenizer.ggml.model'"),
        ({"tokenizer__ggml__eos_token_id": 10**6}, InvalidModelFileError, "eos_token_id"),
        ({"tokenizer__ggml__merges": ["Ġ zq"]}, InvalidModelFileError, "merge 'Ġ zq'"),
        ({"tokenizer__ggml__token_type": [1, 3]}, InvalidModelFileError, "token_type"),
        (
            {"tokenizer__ggml__add_bos_token": True, "tokenizer__ggml__bos_token_id": None},
            InvalidModelFileError,
            "add BOS",
        ),
    ],
)
def test_bad_metadata(metadata: dict[str, Any], changes, error, message) -> None:
    with pytest.raises(error, match=message) as info:
        tokenizer_from_gguf(_with(metadata, **changes), "m.gguf")
    assert "m.gguf" in str(info.value) and "\n" not in str(info.value)


# --- Qwen2.5-Coder-0.5B-Instruct: pre-tokenizer qwen2, 151,936 tokens, ChatML with tools ------

QWEN_TEXTS = [
    *PLAIN,
    "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>",
    "x<|endoftext|>y<|im_end|>",
    "123456789 0.5e-10 2**31-1",
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,  # dropped, as transformers drops None-valued keys
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": "22 °C, sunny"},
    {"role": "tool", "content": "(second result)"},
    {"role": "assistant", "content": "It is 22 °C and sunny in Paris."},
    {"role": "user", "content": "And in 東京?"},
]


@pytest.fixture(scope="module")
def qwen_path() -> Path:
    return model_path("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module")
def qwen(qwen_path: Path) -> Tokenizer:
    return tokenizer_from_gguf(gguf_metadata(qwen_path), qwen_path.name)


@pytest.fixture(scope="module")
def hf_qwen(qwen_path: Path):
    return hf_gguf_tokenizer(qwen_path)


def test_qwen_ids_match_reference(qwen: Tokenizer, hf_qwen) -> None:
    assert len(QWEN_TEXTS) >= 20
    for text in QWEN_TEXTS:
        ids = qwen.encode(text)
        assert ids == hf_qwen.encode(text), text
        assert qwen.encode(text, add_special_tokens=False) == ids  # Qwen adds no BOS
        assert qwen.decode(ids) == hf_qwen.decode(ids) == text
        assert qwen.decode(ids, skip_special_tokens=True) == hf_qwen.decode(
            ids, skip_special_tokens=True
        )


def test_qwen_facts(qwen: Tokenizer) -> None:
    assert (qwen.vocab_size, qwen.bos_id, qwen.eos_id) == (151936, 151643, 151645)
    assert not qwen.add_bos and not qwen.add_eos
    assert qwen.eos_ids == frozenset({151643, 151645})  # <|endoftext|> by llama.cpp's text rule
    assert qwen.encode("<tool_call>") == [151657]  # USER_DEFINED: whole, but not special
    assert 151657 not in qwen.special_ids and 151644 in qwen.special_ids


@pytest.mark.parametrize(
    ("messages", "tools"),
    [(USER_ONLY, None), (FULL_CHAT, None), (TOOL_CHAT, [WEATHER]), (FULL_CHAT, [WEATHER])],
    ids=["user", "system", "tool-calls", "tools-with-system"],
)
def test_qwen_chat_template_matches_reference(qwen: Tokenizer, hf_qwen, messages, tools) -> None:
    for gen in (True, False):
        expected = hf_qwen.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=gen
        )
        got = qwen.apply_chat_template(messages, add_generation_prompt=gen, tools=tools)
        assert got == expected
        ids = qwen.encode(got, add_special_tokens=False)
        assert ids == hf_qwen.encode(expected, add_special_tokens=False)


def test_qwen_streaming(qwen: Tokenizer) -> None:
    for text in STREAM:
        chunks = assert_stream_equals_decode(qwen, qwen.encode(text))
        assert all("\ufffd" not in c for c in chunks)
    rng = random.Random(1)
    byte_ids = [qwen.encode(bytes([b]).decode("latin-1"))[0] for b in range(0x80, 0x100)]
    for _ in range(200):
        n = rng.randrange(1, 10)
        ids = [
            rng.choice(byte_ids) if rng.random() < 0.6 else rng.randrange(151665) for _ in range(n)
        ]
        assert_stream_equals_decode(qwen, ids)
