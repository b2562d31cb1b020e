"""``clearlm chat`` with no message: a multi-turn conversation read line by line.

Each turn renders the whole conversation again with the model's chat template and prefills it
from scratch (no KV cache is kept between turns: simple, and always exactly what the template
says). Lines come from the terminal (with line editing) or from a pipe, one message a line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clearlm.api.speculative import run_generate
from clearlm.cli.app import err
from clearlm.cli.loader import compile_seconds
from clearlm.cli.output import print_stats, write_out
from clearlm.errors import ClearLMError

if TYPE_CHECKING:
    from clearlm.api.model import Model
    from clearlm.sampling.chain import SamplingParams

HELP = (
    "/reset forget the conversation · /system TEXT set the system message (empty: none) · "
    "/help · /bye or Ctrl-D leave · Ctrl-C stops an answer"
)


class Conversation:
    """The messages so far, with an optional system message first."""

    def __init__(self, system: str | None) -> None:
        self.system = system
        self.turns: list[dict[str, str]] = []

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns


def _read_line(interactive: bool) -> str | None:
    """The next line without its newline; None at end of input (Ctrl-D, or the pipe ran dry)."""
    if interactive:
        try:
            return input(">>> ")  # readline editing when available
        except EOFError:
            write_out("\n")
            return None
    raw = sys.stdin.buffer.readline()
    if not raw:
        return None
    return raw.decode("utf-8", errors="replace").removesuffix("\n").removesuffix("\r")


def _command(line: str, conv: Conversation) -> bool:
    """Run a /command; return False when the session should end."""
    name, _, arg = line.partition(" ")
    if name in ("/bye", "/exit", "/quit"):
        return False
    if name == "/reset":
        conv.turns.clear()
        err.print("[dim]conversation cleared[/]")
    elif name == "/system":
        conv.system = arg.strip() or None
        err.print(f"[dim]system message {'set' if conv.system else 'removed'}[/]")
    elif name == "/help":
        err.print(HELP, soft_wrap=True, markup=False)
    else:
        err.print(f"unknown command {name}; {HELP}", soft_wrap=True, markup=False)
    return True


def _answer(
    model: Model,
    conv: Conversation,
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str],
    parse_special_in_content: bool = False,
    quiet: bool = False,
    drafter: Any = None,
) -> None:
    """Stream one answer to the last user message and keep it; on Ctrl-C or an error the
    unanswered message is dropped so the conversation stays well formed. With ``--compile``,
    the answer whose first step built the compiled step gives that time apart on its stats."""
    compiled_before = compile_seconds(model)
    try:
        ids = model.chat_prompt(conv.messages(), parse_special_in_content)
        result = run_generate(model, ids, params, max_new_tokens, stop, write_out, drafter)
    except KeyboardInterrupt:
        conv.turns.pop()
        write_out("\n")
        err.print("[yellow]answer stopped; that message was not kept[/]")
        return
    except ClearLMError as e:
        conv.turns.pop()
        err.print(f"[red]error:[/] {e} (/reset starts a new conversation)", soft_wrap=True)
        return
    write_out("\n")
    conv.turns.append({"role": "assistant", "content": result.text})
    if not quiet:
        built = compile_seconds(model) if compiled_before is None else None  # built in this turn
        print_stats(result, model.config.context_length, built)


def run_repl(
    model: Model,
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str],
    system: str | None,
    parse_special_in_content: bool = False,
    quiet: bool = False,
    drafter: Any = None,
) -> None:
    """Read messages until end of input or /bye, answering each with the whole history
    (message text stays text unless ``parse_special_in_content``, see Model.chat_prompt);
    ``quiet`` leaves out the banner and each answer's stats line; ``drafter``: speculative
    decoding for every answer (clearlm.cli.speculative)."""
    interactive = sys.stdin.isatty()
    conv = Conversation(system)
    if interactive:
        try:  # line editing and ↑ history for input()
            import readline  # noqa: F401
        except ImportError:  # not on every platform; input() still works
            pass
        if not quiet:
            err.print(f"[dim]chat with {model.path} · {HELP}[/]", soft_wrap=True)
    while True:
        try:
            line = _read_line(interactive)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line, keep going
            write_out("\n")
            continue
        if line is None:
            return
        if not line.strip():
            continue
        if line.startswith("/"):
            if not _command(line, conv):
                return
            continue
        conv.turns.append({"role": "user", "content": line})
        try:
            _answer(model, conv, params, max_new_tokens, stop, parse_special_in_content, quiet,
                    drafter)
        except KeyboardInterrupt:  # Ctrl-C just outside the generation: keep turns paired
            if conv.turns and conv.turns[-1]["role"] == "user":
                conv.turns.pop()
            write_out("\n")
