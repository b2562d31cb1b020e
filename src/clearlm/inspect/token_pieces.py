"""Tokens as readable strings: one function shared by ``explain``, the web page and
``Model.to_str_tokens``.

A byte-level BPE or SentencePiece token may hold part of a UTF-8 character (a CJK character is
often three byte tokens). Decoding such a token alone gives U+FFFD ("�"), which hides which
bytes it holds; here every byte that does not complete a character is shown as ``<0xE6>``,
the spelling of SentencePiece's byte tokens and llama.cpp. Complete characters in the same
token stay text (b" \\xe6" → " <0xE6>").
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from typing import Protocol


def _hex_bytes(error: UnicodeError) -> tuple[str, int]:
    """codecs error handler: the offending bytes as <0xNN> pieces."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    bad = error.object[error.start : error.end]
    return "".join(f"<0x{b:02X}>" for b in bad), error.end


codecs.register_error("clearlm-hex", _hex_bytes)


class _HasTokenBytes(Protocol):
    def token_bytes(self, i: int) -> bytes: ...


def bytes_piece(raw: bytes) -> str:
    """UTF-8 bytes → text, each byte that is not part of a whole character as ``<0xNN>``."""
    return raw.decode("utf-8", errors="clearlm-hex")


def token_pieces(tokenizer: _HasTokenBytes, ids: Iterable[int]) -> list[str]:
    """One readable string per token id: its own bytes (``Tokenizer.token_bytes``, so a
    SentencePiece '▁' shows as the space it stands for) with partial characters as ``<0xNN>``.

    Example (byte-level BPE, "日" = E6 97 A5 split into three tokens):
    ``["<0xE6>", "<0x97>", "<0xA5>"]``.
    """
    return [bytes_piece(tokenizer.token_bytes(int(i))) for i in ids]
