"""Tokenizers of Hugging Face folders (tokenizer.json + tokenizer_config.json + ...) against
transformers' ``AutoTokenizer.from_pretrained(folder)``: small BPE pipelines trained here and
saved with ``save_pretrained`` (byte-level, and SentencePiece-style with byte fallback), and the
Gemma 3 / Qwen2.5 tokenizers transformers built from their GGUFs, saved as folders.

Reference quirks (transformers 5):
- ``add_bos_token`` / ``add_eos_token`` in tokenizer_config.json are ignored whenever a
  tokenizer.json exists; its post-processor alone adds BOS/EOS. clearlm does the same, except
  that with no post-processor at all it honours the flags (transformers then adds nothing).
- A folder naming a known class (``"tokenizer_class": "Qwen2Tokenizer"``) is rebuilt from that
  class's code: Qwen2Tokenizer adds an NFC normalizer that the saved tokenizer.json (from the
  GGUF) does not have. clearlm follows tokenizer.json, so it differs on non-NFC text only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from real_parity import hf_gguf_tokenizer
from test_tokenizer import (
    PLAIN,
    STREAM,
    WEATHER,
    assert_stream_equals_decode,
    model_path,
)
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as Backend

from clearlm.errors import (
    ChatTemplateError,
    InvalidModelFileError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from clearlm.tokenizer import StreamingDetokenizer, Tokenizer, tokenizer_from_hf_folder

DATA = Path(__file__).parents[1] / "data"
SPECIALS = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>"]
CHAT = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
USER_FLAGS = {"content": "<|user|>", "lstrip": False, "rstrip": False, "normalized": False}
TOOL_CHAT = "{% for t in tools %}{{ t | tojson }}{% endfor %}" + CHAT
TEXTS = [*PLAIN, "<s>hi</s>", "<|user|>question<|assistant|>answer</s>", "x<unk>y"]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi! 你好"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
]


def _train(kind: str) -> Backend:
    """A ~600-token BPE trained on tests/data/alice.txt: "byte" is GPT-2 style; "sp" is Llama 2
    style (Metaspace, byte-fallback tokens '<0x00>'..'<0xFF>', decoder stripping one space)."""
    text = (DATA / "alice.txt").read_text(encoding="utf-8")
    if kind == "byte":
        tok = Backend(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(
            vocab_size=600, special_tokens=SPECIALS, initial_alphabet=alphabet
        )
        tok.train_from_iterator([text], trainer)
        tok.decoder = decoders.ByteLevel()
    else:
        raw = Backend(models.BPE())
        raw.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
        raw.train_from_iterator([text], trainers.BpeTrainer(vocab_size=600))
        spec = json.loads(raw.to_str())["model"]
        tokens = [*SPECIALS, *(f"<0x{b:02X}>" for b in range(256)), *spec["vocab"]]
        vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
        tok = Backend(models.BPE(vocab, merges, byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single=["<s>", "$A"], special_tokens=[("<s>", bos)]
    )
    return tok


def _save(backend: Backend, folder: Path, **config: Any) -> Path:
    """save_pretrained a PreTrainedTokenizerFast around ``backend``, then patch the config
    (``None`` deletes a key)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT
    fast.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    data = json.loads(path.read_text())
    for key, value in config.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return folder


def _compare(ours: Tokenizer, ref, texts: list[str] = TEXTS) -> None:
    """Ids with and without special tokens, decode both ways, streaming."""
    for text in texts:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.encode(text, add_special_tokens=False) == ref.encode(
            text, add_special_tokens=False
        ), text
        for skip in (False, True):
            assert ours.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), text
        assert_stream_equals_decode(ours, ids)


@pytest.fixture(scope="module", params=["byte", "sp"])
def tiny(request, tmp_path_factory) -> Path:
    return _save(_train(request.param), tmp_path_factory.mktemp(request.param))


def test_tiny_folder_matches_transformers(tiny: Path) -> None:
    from transformers import AutoTokenizer

    ours, ref = tokenizer_from_hf_folder(tiny), AutoTokenizer.from_pretrained(tiny)
    _compare(ours, ref)
    assert (ours.bos_id, ours.eos_id) == (ref.bos_token_id, ref.eos_token_id) == (0, 1)
    assert ours.add_bos and not ours.add_eos and ours.eos_ids == frozenset({1})
    assert ours.special_ids == frozenset(range(5))
    for gen in (True, False):
        expected = ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen)
        assert ours.apply_chat_template(MESSAGES, add_generation_prompt=gen) == expected
    rng = random.Random(0)
    for _ in range(300):
        assert_stream_equals_decode(
            ours, [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(1, 10))]
        )


def test_sp_streaming_holds_byte_runs(tmp_path: Path) -> None:
    tok = tokenizer_from_hf_folder(_save(_train("sp"), tmp_path))
    ids = tok.encode("Alice 東", add_special_tokens=False)  # '東' is not in the vocabulary
    stream = StreamingDetokenizer(tok)
    chunks = [stream.add(i) for i in ids]
    assert chunks[-3:] == ["", "", ""] and stream.flush() == "東"
    assert "".join(chunks) == "Alice "
    assert tok.decode(ids) == "Alice 東"


def test_config_variants_match_transformers(tmp_path: Path) -> None:
    """bos_token as a dict, added_tokens_decoder flags, a new extra special token, named
    templates, generation_config's eos list."""
    from transformers import AutoTokenizer

    folder = _save(
        _train("byte"),
        tmp_path,
        bos_token={"__type": "AddedToken", "content": "<s>", "lstrip": False, "special": True},
        added_tokens_decoder={"3": {**USER_FLAGS, "special": False}},
        additional_special_tokens=["<|tool|>"],
        chat_template=[
            {"name": "default", "template": CHAT},
            {"name": "tool_use", "template": TOOL_CHAT},
        ],
    )
    (folder / "chat_template.jinja").unlink()  # the config's list is used
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 4]}))
    ours, ref = tokenizer_from_hf_folder(folder), AutoTokenizer.from_pretrained(folder)
    _compare(ours, ref, [*TEXTS, "call <|tool|> now"])
    # the config marks <|user|> not special, yet `tokenizers` (so transformers) still skips it
    assert {3, 4} <= ours.special_ids and not ours.backend.get_added_tokens_decoder()[3].special
    assert ours.encode("<|tool|>", add_special_tokens=False) == [ours.vocab_size - 1]
    assert ours.eos_ids == frozenset({1, 4})
    for tools in (None, [WEATHER]):
        expected = ref.apply_chat_template(MESSAGES, tools=tools, tokenize=False)
        assert ours.apply_chat_template(MESSAGES, False, tools=tools) == expected
    assert ours.chat_templates.keys() == {"tool_use"}


def test_chat_template_file_wins(tmp_path: Path) -> None:
    folder = _save(_train("byte"), tmp_path, chat_template="config {{ messages | length }}")
    (folder / "chat_template.jinja").write_text("file {{ messages | length }}")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 4}))
    tok = tokenizer_from_hf_folder(folder)
    assert tok.apply_chat_template(MESSAGES) == "file 4"
    assert tok.eos_ids == frozenset({1, 4})
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": TOOL_CHAT}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = tokenizer_from_hf_folder(folder)
    with pytest.raises(ChatTemplateError, match="no chat template .only named ones: tool_use"):
        tok.apply_chat_template(MESSAGES)
    assert tok.apply_chat_template(MESSAGES, tools=[WEATHER]).startswith('{"type": "function"')


def test_bos_never_twice(tmp_path: Path) -> None:
    """The post-processor adds BOS; add_bos_token in the config must not add another."""
    from transformers import AutoTokenizer

    for flag in (True, False):
        folder = _save(_train("byte"), tmp_path / str(flag), add_bos_token=flag)
        ours, ref = tokenizer_from_hf_folder(folder), AutoTokenizer.from_pretrained(folder)
        assert ours.encode("Alice") == ref.encode("Alice")
        assert ours.encode("Alice")[:2].count(0) == 1 and ours.add_bos
        # the chat template writes BOS itself: encode its text without special tokens
        prompt = ours.apply_chat_template(MESSAGES)
        assert ours.encode(prompt, add_special_tokens=False).count(0) == 1


def test_flags_apply_without_post_processor(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = _save(_train("byte"), tmp_path, add_bos_token=True, add_eos_token=True)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    ours = tokenizer_from_hf_folder(folder)
    body = ours.encode("Alice", add_special_tokens=False)
    assert ours.encode("Alice") == [0, *body, 1] and ours.add_bos and ours.add_eos
    assert AutoTokenizer.from_pretrained(folder).encode("Alice") == body  # transformers 5


def test_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        tokenizer_from_hf_folder(tmp_path / "absent")
    with pytest.raises(ModelNotFoundError, match=f"{tmp_path} has no tokenizer.json"):
        tokenizer_from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x00")
    with pytest.raises(UnsupportedModelError, match="tokenizer.model.*needs tokenizer.json"):
        tokenizer_from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InvalidModelFileError, match="tokenizer.json is not a tokenizers"):
        tokenizer_from_hf_folder(tmp_path)
    folder = _save(_train("byte"), tmp_path / "ok")
    (folder / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(InvalidModelFileError, match="tokenizer_config.json is not valid JSON"):
        tokenizer_from_hf_folder(folder)
    (folder / "tokenizer_config.json").write_text("{}")
    (folder / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(InvalidModelFileError, match="eos_token_id 'x'"):
        tokenizer_from_hf_folder(folder)
    (folder / "generation_config.json").unlink()
    backend = Backend.from_file(str(folder / "tokenizer.json"))
    for decoder, message in [
        (decoders.WordPiece(), "decoder 'WordPiece'"),
        (decoders.Strip(" ", 0, 1), "cannot be streamed"),
        (decoders.Sequence([decoders.ByteLevel(), decoders.Fuse()]), "cannot be streamed"),
    ]:
        backend.decoder = decoder
        backend.save(str(folder / "tokenizer.json"))
        with pytest.raises(UnsupportedModelError, match=message):
            tokenizer_from_hf_folder(folder)


# --- Gemma 3 and Qwen2.5 tokenizers that transformers built from the GGUFs, saved as folders --


@pytest.fixture(scope="module", params=["gemma3-270m", "qwen2.5-coder-0.5b-instruct"])
def saved(request, tmp_path_factory) -> tuple[Path, Any]:
    ref = hf_gguf_tokenizer(model_path(request.param))
    folder = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(folder)
    return folder, ref


def test_saved_gguf_tokenizers_match(saved: tuple[Path, Any]) -> None:
    from transformers import AutoTokenizer

    folder, gguf_ref = saved
    ours = tokenizer_from_hf_folder(folder)
    specials = ["<start_of_turn>user\nhi<end_of_turn>", "<|im_start|>user\nhi<|im_end|>"]
    texts = [*PLAIN, *STREAM, *specials, "<tool_call>x</tool_call>\n\n\t\t<table>"]
    _compare(ours, gguf_ref, texts)
    _compare(ours, AutoTokenizer.from_pretrained(folder), texts)  # all NFC text: same pipeline
    assert ours.add_bos == bool(gguf_ref.add_bos_token)
    if gguf_ref.chat_template is not None:
        for tools in (None, [WEATHER]):
            expected = gguf_ref.apply_chat_template(MESSAGES, tools=tools, tokenize=False)
            assert ours.apply_chat_template(MESSAGES, False, tools=tools) == expected


@pytest.mark.parametrize("saved", ["qwen2.5-coder-0.5b-instruct"], indirect=True)
def test_class_rebuild_adds_nfc(saved: tuple[Path, Any]) -> None:
    from transformers import AutoTokenizer

    folder, gguf_ref = saved
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == (
        "Qwen2Tokenizer"
    )
    ours, rebuilt = tokenizer_from_hf_folder(folder), AutoTokenizer.from_pretrained(folder)
    text = "cafe\u0301"  # 'e' + combining acute: NFC makes it 'é'
    assert ours.encode(text) == gguf_ref.encode(text) != rebuilt.encode(text)
    assert rebuilt.encode(text) == ours.encode("caf\u00e9")


# --- the streaming decoder against `tokenizers`' own decoders, piece lists at random ----------

_PIECES = [
    *(f"<0x{b:02X}>" for b in (0x20, 0x41, 0xE4, 0xB8, 0xAD, 0xF0, 0x9F, 0x98, 0x80, 0xFF, 0x81)),
    "<0xe4>", "<0x+4>", "<0x>", "▁", "▁▁", "▁a", "a▁b▁", " ", "  x ", "x", "中", "Ġh", "Ċ", "ä",
    "<|im_end|>", "",
]  # fmt: skip
_CHAINS = {
    "byte-level": decoders.ByteLevel(),
    "llama": decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    ),  # fmt: skip
    "gemma": decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    ),
    "metaspace-always": decoders.Metaspace(prepend_scheme="always"),
    "metaspace-never": decoders.Metaspace(prepend_scheme="never"),
    "fallback-then-metaspace": decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()]),
    "metaspace-then-fallback": decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()]),
    "strip-each": decoders.Sequence([decoders.ByteFallback(), decoders.Strip(" ", 2, 0)]),
    "fuse-then-strip-2": decoders.Sequence([decoders.Fuse(), decoders.Strip(" ", 2, 0)]),
    "none": None,
}


@pytest.mark.parametrize("name", list(_CHAINS))
def test_stream_equals_tokenizers_decoders(name: str) -> None:
    from clearlm.tokenizer.stream import DecodeRule, TextStream

    decoder = _CHAINS[name]
    rule = DecodeRule.of(decoder, name)
    rng = random.Random(name)
    for _ in range(400):
        pieces = [rng.choice(_PIECES) for _ in range(rng.randrange(1, 9))]
        stream = TextStream(rule)
        text = "".join(stream.push(p) for p in pieces) + stream.flush()
        expected = " ".join(pieces) if decoder is None else decoder.decode(pieces)
        assert text == expected, pieces
