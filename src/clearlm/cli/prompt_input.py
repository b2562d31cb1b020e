"""Where a prompt comes from: the argument, standard input (``-``) or a file (``-f FILE``).

Everything goes through :mod:`clearlm.text`: files and standard input are read as bytes and
decoded as UTF-8 with invalid bytes replaced by U+FFFD, with no newline translation (a "\\r\\n"
stays "\\r\\n"); an argument's undecodable bytes become U+FFFD too. One line ending at the very
end ("\\n" or "\\r\\n") is dropped, as llama.cpp drops a prompt file's last "\\n": ``echo "q" |
clearlm generate -`` answers as ``clearlm generate "q"`` does (``perplexity`` reads its file
exactly).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from clearlm.cli.app import err
from clearlm.text import clean_arg, read_stdin_text, read_text_file


def resolve_prompt(argument: str | None, file: Path | None, what: str = "PROMPT") -> str | None:
    """The prompt text: ``-`` reads standard input, ``-f FILE`` a file, else the argument itself
    (None when neither was given; ``-`` at a terminal says on stderr how to end the input).
    Raises typer.BadParameter (a usage error) when both are
    given, ClearLMError when the file is missing or unreadable."""
    if argument is not None and file is not None:
        raise typer.BadParameter(f"give {what} or -f FILE, not both", param_hint="'-f'")
    if file is not None:
        return drop_last_newline(read_text_file(file, what="prompt file"))
    if argument == "-":
        if sys.stdin.isatty():  # a person at a terminal may not know the shell waits for them
            err.print("[dim]reading the prompt from standard input; end with Ctrl-D[/]")
        return drop_last_newline(read_stdin_text())
    return None if argument is None else clean_arg(argument)


def drop_last_newline(text: str) -> str:
    """``text`` less one line ending at its very end ("\\n" or "\\r\\n"), which `echo`, editors
    and here-documents add; an earlier blank line stays ("a\\n\\n" -> "a\\n")."""
    return text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
