"""Text as it enters clearlm: always valid Unicode, files exactly as they are on disk.

Every place that takes text from outside (the API, command-line arguments, files, standard
input, the web page) passes it through one of these functions, so nothing downstream sees a
string that the `tokenizers` library rejects ("TextInputSequence must be str") or that cannot be
written back as UTF-8.

- Lone surrogates (``"ok\\ud800bad"``, possible in a Python str or a JSON escape) become U+FFFD;
  a surrogate pair written as two code points becomes its one character.
- Command-line arguments that are not valid UTF-8 reach Python as ``\\udcXX`` escapes
  (PEP 383 surrogateescape); their original bytes are decoded as UTF-8, each invalid sequence
  becoming U+FFFD (``$'caf\\xe9'`` → ``'caf\\ufffd'``).
- Files and standard input are read as bytes and decoded as UTF-8: no newline translation (a
  ``\\r\\n`` stays two characters), a byte-order mark is kept as the character U+FEFF, and
  invalid bytes become U+FFFD unless ``strict=True`` asks for an error instead.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from clearlm.errors import ClearLMError

REPLACEMENT = "\ufffd"


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (a valid pair is joined).

    Raises:
        ClearLMError: ``text`` is not a str (e.g. bytes or None).
    """
    if not isinstance(text, str):
        raise ClearLMError(f"expected text (a str), got {type(text).__name__}")
    try:
        text.encode("utf-8")
        return text  # the common case: already valid
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_arg(arg: str) -> str:
    """A command-line argument as UTF-8 text: undecodable bytes (``\\udcXX`` escapes from
    ``sys.argv``) are decoded back from the original bytes, invalid ones → U+FFFD."""
    try:
        raw = os.fsencode(arg)  # the argument's original bytes (surrogateescape)
    except UnicodeEncodeError:  # a surrogate that no argv decoding produces
        return clean_text(arg)
    return raw.decode("utf-8", "replace")


def decode_utf8(data: bytes, source: str, strict: bool = False) -> str:
    """``data`` decoded as UTF-8: invalid bytes → U+FFFD with one ``clearlm:`` warning (the CLI
    prints it as a ``warning:`` line) naming ``source`` and the first bad byte, or an error if
    ``strict``.

    Raises:
        ClearLMError: ``strict`` and ``data`` is not valid UTF-8 (names ``source`` and the
            first bad byte's offset).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = f"invalid byte 0x{data[e.start]:02x} at offset {e.start}"
        where = f"{source} is not UTF-8 text ({bad})"
        if strict:
            raise ClearLMError(f"{where}; convert it to UTF-8, e.g. iconv -t utf-8") from None
    warnings.warn(f"clearlm: {where}; its invalid bytes became U+FFFD", stacklevel=2)
    return data.decode("utf-8", "replace")


def read_text_file(
    path: str | os.PathLike[str], strict: bool = False, what: str = "text file"
) -> str:
    """The exact characters of a UTF-8 text file: read as bytes, no newline translation.

    Args:
        path: the file.
        strict: raise on invalid UTF-8 instead of replacing it with U+FFFD.
        what: how the error messages name the file ("prompt file").

    Raises:
        ClearLMError: the file does not exist, is a directory or cannot be read (one line
            naming it), or ``strict`` and it is not UTF-8.
    """
    p = Path(path)
    name = clean_arg(str(p))  # printable even if the name is not UTF-8
    if p.is_dir():
        raise ClearLMError(f"{name} is a directory, not a file; give the {what} itself")
    if not p.exists():  # pipes and devices (`-f <(cmd)`, /dev/stdin, a FIFO) are read too
        raise ClearLMError(f"{what} not found: {name}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ClearLMError(f"cannot read {name}: {e.strerror or e}") from None
    return decode_utf8(data, name, strict)


def read_stdin_text(strict: bool = False) -> str:
    """All of standard input as text: bytes decoded as UTF-8, no newline translation.

    Raises:
        ClearLMError: ``strict`` and the input is not UTF-8.
    """
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # stdin replaced by a text-only object (tests, embedding)
        return clean_text(sys.stdin.read())
    return decode_utf8(stream.read(), "standard input", strict)
