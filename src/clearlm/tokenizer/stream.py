"""Token ids → text one token at a time, exactly as the tokenizer's decoder turns them into text.

`tokenizers` decodes a whole list at once: id → token string, then the decoder chain
(``decoders.Sequence``) rewrites the list, then the pieces are joined. To stream, each decoder of
the chain becomes a *stage* that takes one piece at a time and returns the text it can already
give; chaining the stages gives the same string as ``Tokenizer.decode``, piece for piece:

- ``ByteLevel`` (GPT-2 family): each token's bytes (see :func:`byte_level_bytes`) go through an
  incremental UTF-8 decoder. Bytes are held only while they are a valid but incomplete UTF-8
  sequence (at most 3 bytes); invalid bytes become U+FFFD per maximal invalid subpart, as Rust's
  ``from_utf8_lossy`` (which the decoder uses) does.
- ``ByteFallback`` (SentencePiece family: '<0xE4>' tokens): `tokenizers` decodes a *run* of byte
  tokens as one string, and if the run is not valid UTF-8 it gives one U+FFFD per byte of the
  whole run (tokenizers/src/decoders/byte_fallback.rs). A later byte can spoil earlier ones, so a
  run is held until a non-byte token (or ``flush``) ends it.
- ``Replace``, ``Strip``, ``Metaspace`` rewrite each piece; ``Metaspace`` drops every '▁' of the
  first piece, a ``Strip`` after ``Fuse`` strips the start of the whole text only.

Any other decoder (WordPiece, CTC, regex ``Replace``) is refused when the tokenizer is built.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from clearlm.errors import UnsupportedModelError


def bytes_to_unicode() -> dict[int, str]:
    """Byte → the printable character byte-level BPE spells it with (space → 'Ġ'); the table of
    openai/gpt-2 src/encoder.py, bytes_to_unicode."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
# ByteFallback's test (tokenizers byte_fallback.rs): six bytes, '<0x', then two characters Rust's
# u8::from_str_radix(_, 16) accepts (either case; even '+4'), then '>'.
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2}|\+[0-9A-Fa-f])>")
_STREAMABLE = ("ByteLevel", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace")


def byte_level_bytes(token: str) -> bytes:
    """The bytes a byte-level token stands for, by the rule of `tokenizers`' ByteLevel decoder:
    map each character back to its byte, or, if any character is outside the byte alphabet (an
    added token such as '<｜end▁of▁sentence｜>'), take the text's UTF-8 as is."""
    if all(c in CHAR_TO_BYTE for c in token):
        return bytes(CHAR_TO_BYTE[c] for c in token)
    return token.encode("utf-8")


def fallback_byte(token: str) -> int | None:
    """The byte of a SentencePiece byte token ('<0xE4>' → 0xE4), else None."""
    m = _BYTE_TOKEN.fullmatch(token)
    return int(m.group(1), 16) if m else None


class _Stage:
    """One decoder of the chain: ``push`` a piece, get the pieces it can already pass on."""

    def push(self, piece: str) -> list[str]:
        raise NotImplementedError

    def flush(self) -> list[str]:
        return []


@dataclass
class _PerPiece(_Stage):
    """Replace, per-token Strip, Metaspace: ``fn(index, piece)``; index counts pieces seen."""

    fn: Callable[[int, str], str]
    fused: bool = False  # after Fuse the whole text is piece 0
    index: int = 0

    def push(self, piece: str) -> list[str]:
        out = self.fn(self.index, piece)
        if not self.fused:
            self.index += 1
        return [out]


@dataclass
class _StripStart(_Stage):
    """Strip after Fuse: at most ``left`` leading ``content`` characters of the whole text."""

    content: str
    left: int

    def push(self, piece: str) -> list[str]:
        i = 0
        while self.left and i < len(piece) and piece[i] == self.content:
            i, self.left = i + 1, self.left - 1
        if i < len(piece):
            self.left = 0  # text has begun: nothing more to strip
        return [piece[i:]]


class _ByteFallback(_Stage):
    """Runs of '<0xNN>' tokens → their UTF-8 text, or U+FFFD per byte if the run is invalid."""

    def __init__(self) -> None:
        self.run = bytearray()

    def push(self, piece: str) -> list[str]:
        b = fallback_byte(piece)
        if b is not None:
            self.run.append(b)
            return []
        return [*self.flush(), piece]

    def flush(self) -> list[str]:
        if not self.run:
            return []
        try:
            out = [self.run.decode("utf-8")]
        except UnicodeDecodeError:
            out = ["\ufffd"] * len(self.run)
        self.run.clear()
        return out


class _ByteLevel(_Stage):
    def __init__(self) -> None:
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: str) -> list[str]:
        return [self.utf8.decode(byte_level_bytes(piece))]

    def flush(self) -> list[str]:
        text = self.utf8.decode(b"", final=True)
        self.utf8.reset()
        return [text]


@dataclass
class _JoinSpaces(_Stage):
    """No decoder at all: `tokenizers` joins the tokens with single spaces."""

    started: bool = False

    def push(self, piece: str) -> list[str]:
        out = " " + piece if self.started else piece
        self.started = True
        return [out]


def _metaspace(replacement: str, prepend: bool) -> Callable[[int, str], str]:
    # tokenizers decoders/metaspace.rs: in the first piece every replacement character is
    # dropped (not only a leading one) unless prepend_scheme is "never".
    def fn(index: int, piece: str) -> str:
        return piece.replace(replacement, "" if index == 0 and prepend else " ")

    return fn


def _strip(content: str, left: int) -> Callable[[int, str], str]:
    """Strip before Fuse: at most ``left`` leading ``content`` characters of each piece."""

    def fn(index: int, piece: str) -> str:
        start = 0
        while start < min(left, len(piece)) and piece[start] == content:
            start += 1
        return piece[start:]

    return fn


@dataclass(frozen=True)
class DecodeRule:
    """The decoder chain of a `tokenizers` pipeline, as JSON steps (``[]`` = no decoder)."""

    steps: tuple[dict[str, Any], ...]
    has_decoder: bool

    @classmethod
    def of(cls, decoder: Any, source: str) -> DecodeRule:
        """Read ``backend.decoder`` (None or a `tokenizers` decoder).

        Raises:
            UnsupportedModelError: a decoder clearlm cannot stream exactly (named in the message).
        """
        if decoder is None:
            return cls((), False)
        spec = json.loads(decoder.__getstate__())
        steps = tuple(spec["decoders"]) if spec["type"] == "Sequence" else (spec,)
        fused = False
        for i, step in enumerate(steps):
            kind = step["type"]
            if kind not in _STREAMABLE:
                raise UnsupportedModelError(
                    f"{source} uses decoder {kind!r}; clearlm streams ByteLevel and "
                    "SentencePiece-style decoders (Replace, ByteFallback, Fuse, Strip, Metaspace)"
                )
            pattern = step.get("pattern", {}).get("String", "")
            if (
                (kind == "ByteLevel" and (fused or i != len(steps) - 1))
                or (kind == "Replace" and "String" not in step["pattern"])
                or (fused and kind == "Replace" and len(pattern) > 1)  # could span two pieces
                # stripping the end would hold text back (and tokenizers' own per-token version
                # panics on short pieces); no known tokenizer uses it
                or (kind == "Strip" and step["stop"])
            ):
                raise UnsupportedModelError(f"{source}: decoder step {step} cannot be streamed")
            fused = fused or kind == "Fuse"
        return cls(steps, True)

    def stages(self) -> list[_Stage]:
        """Fresh streaming stages for one stream."""
        if not self.has_decoder:
            return [_JoinSpaces()]
        out: list[_Stage] = []
        fused = False
        for step in self.steps:
            kind = step["type"]
            if kind == "ByteLevel":
                out.append(_ByteLevel())
            elif kind == "ByteFallback":
                out.append(_ByteFallback())
            elif kind == "Fuse":
                fused = True
            elif kind == "Replace":
                pattern, content = step["pattern"]["String"], step["content"]
                out.append(_PerPiece(lambda i, p, a=pattern, b=content: p.replace(a, b), fused))
            elif kind == "Metaspace":
                prepend = step.get("prepend_scheme", "always") != "never"
                out.append(_PerPiece(_metaspace(step["replacement"], prepend), fused))
            elif kind == "Strip":
                if fused:
                    out.append(_StripStart(step["content"], step["start"]))
                else:
                    out.append(_PerPiece(_strip(step["content"], step["start"])))
            # `of` refused every other kind
        return out

    def piece_bytes(self, piece: str) -> bytes:
        """The bytes one token stands for on its own (not at the start of the text)."""
        if not self.has_decoder:
            return piece.encode("utf-8")
        for step in self.steps:
            kind = step["type"]
            if kind == "ByteLevel":
                return byte_level_bytes(piece)
            if kind == "ByteFallback" and (b := fallback_byte(piece)) is not None:
                return bytes([b])
            if kind == "Replace":
                piece = piece.replace(step["pattern"]["String"], step["content"])
            elif kind == "Metaspace":
                piece = piece.replace(step["replacement"], " ")
        return piece.encode("utf-8")


class TextStream:
    """The stages of one :class:`DecodeRule` run piece by piece."""

    def __init__(self, rule: DecodeRule) -> None:
        self.rule = rule
        self.stages = rule.stages()

    def _run(self, pieces: Iterable[str], start: int) -> list[str]:
        for stage in self.stages[start:]:
            pieces = [out for p in pieces for out in stage.push(p)]
        return list(pieces)

    def push(self, piece: str) -> str:
        return "".join(self._run([piece], 0))

    def flush(self) -> str:
        """Emit what every stage holds, in chain order, and start afresh."""
        text = []
        for i, stage in enumerate(self.stages):
            text.extend(self._run(stage.flush(), i + 1))
        self.stages = self.rule.stages()
        return "".join(text)
