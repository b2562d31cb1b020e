"""Tokenizer from GGUF metadata, built on `tokenizers`; streaming detokenizer; chat template.

A GGUF has no ``tokenizer.json``: it stores vocabulary, merges, token types and special ids as
``tokenizer.ggml.*`` metadata and only names the pre-tokenizer (``tokenizer.ggml.pre``), whose
regexes live in llama.cpp (src/llama-vocab.cpp). One table maps each name to the `tokenizers`
pre-tokenizer of the model's original tokenizer.json. Reference: transformers' GGUF tokenizer
(integrations/gguf/gguf_tokenizer_mapping.py).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _Backend

from clearlm.errors import (
    ChatTemplateError,
    InvalidModelFileError,
    UnsupportedModelError,
)

# llama.cpp's token types (llama.h, enum llama_token_type).
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


def _bytes_to_unicode() -> dict[int, str]:
    """Byte → the printable character byte-level BPE spells it with (space → 'Ġ'); the table of
    openai/gpt-2 src/encoder.py, bytes_to_unicode."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return table


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _byte_level_bytes(token: str) -> bytes:
    """The bytes a byte-level token stands for, by the rule of `tokenizers`' ByteLevel decoder:
    map each character back to its byte, or, if any character is outside the byte alphabet (an
    added token such as '<｜end▁of▁sentence｜>'), take the text's UTF-8 as is."""
    if all(c in _CHAR_TO_BYTE for c in token):
        return bytes(_CHAR_TO_BYTE[c] for c in token)
    return token.encode("utf-8")


# tokenizer.ggml.pre → pre-tokenizer. Regexes are the originals from each model's tokenizer.json,
# as quoted in llama-vocab.cpp (llama.cpp runs hand-expanded rewrites of the same patterns).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level() -> pre_tokenizers.PreTokenizer:
    """GPT-2: its own regex, then bytes → byte alphabet."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _split_then_bytes(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    # llama.cpp's "default" adds punctuation and digit pre-splits; transformers (our reference)
    # uses GPT-2's. "gpt-2" is llama.cpp's label for GPT-2 and its kin (phi-2, roberta-bpe).
    "default": _byte_level,
    "gpt-2": _byte_level,
    "gpt2": _byte_level,
    # SmolLM's tokenizer.json and llama.cpp: every digit alone first, then GPT-2's regex.
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _byte_level()]
    ),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}


def _require(metadata: Mapping[str, Any], key: str, source: str) -> Any:
    if key not in metadata:
        raise InvalidModelFileError(f"{source} has no tokenizer metadata key {key!r}")
    return metadata[key]


def _byte_level_bpe(
    tokens: list[str], types: list[int], metadata: Mapping[str, Any], source: str
) -> _Backend:
    """A ``gpt2`` vocabulary: byte-level BPE (what transformers' GPT2Tokenizer builds), with the
    pre-tokenizer ``tokenizer.ggml.pre`` names and a ByteLevel decoder.

    A NORMAL token the file spells outside the byte alphabet is respelled byte by byte, as
    transformers does; CONTROL / USER_DEFINED tokens keep their text, so registering them as
    added tokens finds their id instead of growing the vocabulary.
    """
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{source} uses pre-tokenizer {pre!r}; supported: {', '.join(PRE_TOKENIZERS)}"
        )
    vocab: dict[str, int] = {}
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind not in (CONTROL, USER_DEFINED) and not all(c in _CHAR_TO_BYTE for c in token):
            token = "".join(_BYTE_TO_CHAR[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, i)  # a duplicate spelling keeps its first id
    merges = []
    for merge in _require(metadata, "tokenizer.ggml.merges", source):
        a, _, b = merge.partition(" ")
        if a not in vocab or b not in vocab or a + b not in vocab:  # tokenizers would panic
            raise InvalidModelFileError(f"{source}: BPE merge {merge!r} leaves the vocabulary")
        merges.append((a, b))
    # llama.cpp sets tokenizer_ignore_merges for Llama 3 (a word already in the vocabulary is
    # taken whole), as does Llama 3's tokenizer.json ("ignore_merges": true).
    backend = _Backend(models.BPE(vocab, merges, ignore_merges=pre == "llama-bpe"))
    backend.pre_tokenizer = PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    return backend


# tokenizer.ggml.model → (backend builder, bytes-of-a-token rule, BOS default when
# tokenizer.ggml.add_bos_token is absent). SentencePiece ("llama") will add a row here.
_TOKENIZER_MODELS: dict[str, tuple[Callable[..., _Backend], Callable[[str], bytes], bool]] = {
    "gpt2": (_byte_level_bpe, _byte_level_bytes, False),
}


def _token_id(metadata: Mapping[str, Any], name: str, vocab_size: int, source: str) -> int | None:
    i = metadata.get(f"tokenizer.ggml.{name}_token_id")
    if i is not None and not 0 <= i < vocab_size:
        raise InvalidModelFileError(f"{source}: {name}_token_id {i} is outside the vocabulary")
    return i


@dataclass(eq=False)
class Tokenizer:
    """Text ↔ token ids for one model, plus its chat template. Build it with
    :meth:`from_gguf_metadata`; ``eos_ids`` holds every id that ends generation (EOS, end of
    turn, end of message); ``special_ids`` are the CONTROL tokens ``skip_special_tokens`` drops."""

    backend: _Backend = field(repr=False)  # the `tokenizers` pipeline: model, pre-tokenizer, ...
    tokens: list[str] = field(repr=False)  # id → token as the file spells it
    token_to_bytes: Callable[[str], bytes] = field(repr=False)  # token text → its raw bytes
    special_ids: frozenset[int] = field(repr=False)
    bos_id: int | None
    eos_id: int | None
    eos_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    chat_template: str | None = field(repr=False)
    source: str

    @property
    def vocab_size(self) -> int:
        """Number of token ids (the model's embedding rows)."""
        return len(self.tokens)

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], source: str = "GGUF file"
    ) -> Tokenizer:
        """Build the tokenizer a GGUF describes, from ``read_metadata(open_gguf(path))``.

        Args:
            metadata: the file's metadata as plain Python values.
            source: the file's name, for error messages.

        Raises:
            UnsupportedModelError: ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre`` is one
                clearlm does not implement (the message lists the supported ones).
            InvalidModelFileError: a required key is missing, or ids/merges are inconsistent.
        """
        kind = _require(metadata, "tokenizer.ggml.model", source)
        if kind not in _TOKENIZER_MODELS:
            raise UnsupportedModelError(
                f"{source} uses tokenizer model {kind!r}; supported: {', '.join(_TOKENIZER_MODELS)}"
            )
        build, to_bytes, bos_default = _TOKENIZER_MODELS[kind]
        tokens = _require(metadata, "tokenizer.ggml.tokens", source)
        types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise InvalidModelFileError(f"{source}: token_type and tokens differ in length")
        backend = build(tokens, types, metadata, source)
        # CONTROL → special (skippable when decoding); USER_DEFINED → plain added token. Both
        # are matched whole in the text before the model, as in llama.cpp and transformers.
        added = [
            AddedToken(t, special=k == CONTROL, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k in (CONTROL, USER_DEFINED)
        ]
        backend.add_special_tokens([a for a in added if a.special])
        backend.add_tokens([a for a in added if not a.special])
        bos, eos, eot, eom = (
            _token_id(metadata, name, len(tokens), source) for name in ("bos", "eos", "eot", "eom")
        )
        add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", bos_default))
        add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        if (add_bos and bos is None) or (add_eos and eos is None):
            raise InvalidModelFileError(f"{source} asks to add BOS/EOS but gives no token id")
        special = frozenset(i for i, k in enumerate(types) if k == CONTROL)
        ends = frozenset(i for i in (eos, eot, eom) if i is not None)
        chat = metadata.get("tokenizer.chat_template")
        return cls(
            backend, tokens, to_bytes, special, bos, eos, ends, add_bos, add_eos, chat, source
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. Special-token text ('<|im_start|>') always maps to its one id;
        ``add_special_tokens`` only controls the BOS/EOS the model asks for (add_bos / add_eos)."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_special_tokens and self.add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD. ``skip_special_tokens`` drops CONTROL
        tokens ('<|im_end|>') but keeps USER_DEFINED ones."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, i: int) -> str:
        """Token ``i`` as the file spells it (byte-level BPE: 'Ġhello' for ' hello')."""
        return self.tokens[i]

    def token_bytes(self, i: int) -> bytes:
        """The raw bytes token ``i`` stands for (b' hello'); a token may hold part of a
        character. ``decode(ids)`` is these bytes joined and read as UTF-8 with replacement."""
        return self.token_to_bytes(self.tokens[i])

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` ([{'role': 'user', 'content': '...'}, ...]) to prompt text.

        Rendered like transformers' ``apply_chat_template(..., tokenize=False)``: the same
        sandboxed jinja2 environment and template variables (messages, add_generation_prompt,
        tools=None, documents=None, bos_token, eos_token). Encode the result with
        ``add_special_tokens=False`` if the template already writes the BOS.

        Raises:
            ChatTemplateError: no template, or it failed to compile or render (including its own
                ``raise_exception('...')``, e.g. on roles that do not alternate).
        """
        if self.chat_template is None:
            raise ChatTemplateError(f"{self.source} has no chat template (tokenizer.chat_template)")
        names = {"bos_token": self.bos_id, "eos_token": self.eos_id}
        variables = {k: self.tokens[i] for k, i in names.items() if i is not None}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt)
        variables.update(tools=None, documents=None)  # defined but empty, as in transformers
        try:
            return _compile_chat_template(self.chat_template).render(**variables)
        except Exception as e:  # jinja2.TemplateError, or TypeError etc. from odd messages
            msg = f"chat template of {self.source} failed ({type(e).__name__}: {e})"
            raise ChatTemplateError(msg) from None


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it for
    training masks); here it renders its body unchanged so such templates compile."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


@lru_cache(maxsize=8)
def _compile_chat_template(template: str) -> jinja2.Template:
    """Settings of transformers' chat_template_utils._compile_jinja_template: HF-style whitespace
    (trim_blocks, lstrip_blocks), loop controls, a tojson that keeps non-ASCII (jinja's own
    escapes HTML), raise_exception, strftime_now."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, **{"ensure_ascii": False, **kw})
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class StreamingDetokenizer:
    """Turns ids into text one at a time, never yielding half a character.

    Byte-level tokens can split a character (a CJK character is 3 UTF-8 bytes, an emoji 4), so
    each token's bytes go through an incremental UTF-8 decoder. The rule: bytes are held back
    only while they are a valid but incomplete UTF-8 sequence (at most 3 bytes); as soon as a byte
    makes it invalid, U+FFFD is emitted for it (per maximal invalid subpart, as Python and Rust's
    from_utf8_lossy both do), and ``flush`` emits U+FFFD for an incomplete tail. So nothing is held
    forever, each step costs O(bytes of the new token), and all outputs plus ``flush()`` equal
    ``tokenizer.decode(ids, skip_special_tokens)``. (vLLM and HF's TextStreamer re-decode from a
    prefix offset and hold text ending in U+FFFD; with token bytes the rule can be exact.)
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """Feed one id; returns the text it completes (possibly '')."""
        if self.skip_special_tokens and token_id in self.tokenizer.special_ids:
            return ""
        return self._utf8.decode(self.tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Emit what is held (U+FFFD for an incomplete character) and start afresh."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
