"""Where a prompt comes from: the argument, standard input (``-``) or a file (``-f FILE``).

Text is read as bytes and decoded as UTF-8 with invalid bytes replaced by U+FFFD, with no
newline translation (a "\\r\\n" stays "\\r\\n"): the model sees the file's characters as they are.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from clearlm.errors import ClearLMError


def read_text_file(path: str | Path) -> str:
    """A file's text (UTF-8, invalid bytes → U+FFFD, newlines untouched).

    Raises ClearLMError when the file is missing or cannot be read."""
    p = Path(path)
    if not p.is_file():
        raise ClearLMError(f"prompt file not found: {path}")
    try:
        return p.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ClearLMError(f"cannot read prompt file {path}: {e.strerror}") from None


def read_stdin_text() -> str:
    """All of standard input as text (UTF-8, invalid bytes → U+FFFD, newlines untouched)."""
    return sys.stdin.buffer.read().decode("utf-8", errors="replace")


def resolve_prompt(argument: str | None, file: Path | None, what: str = "PROMPT") -> str | None:
    """The prompt text: ``-`` reads standard input, ``-f FILE`` a file, else the argument itself
    (None when neither was given). Raises typer.BadParameter (a usage error) when both are given."""
    if argument is not None and file is not None:
        raise typer.BadParameter(f"give {what} or -f FILE, not both", param_hint="'-f'")
    if file is not None:
        return read_text_file(file)
    if argument == "-":
        return read_stdin_text()
    return argument
