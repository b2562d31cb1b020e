"""``clearlm chat`` (and ``clearlm run``) with no message: a multi-turn conversation read line
by line.

Each turn renders the whole conversation again with the model's chat template and prefills it
from scratch (no KV cache is kept between turns: simple, and always exactly what the template
says). Lines come from the terminal (with line editing) or from a pipe, one message a line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer
from rich.text import Text

from clearlm.cli.app import err
from clearlm.cli.context_size import context_limit, generate_within, warn_past_model
from clearlm.cli.loader import compile_seconds, load_model, model_label, set_decode
from clearlm.cli.output import print_stats, write_out
from clearlm.errors import ClearLMError
from clearlm.text import decode_utf8

if TYPE_CHECKING:  # (this module imports no torch: the checks before the load answer at once)
    from clearlm.api.model import Model
    from clearlm.cli.placement import Placement
    from clearlm.sampling.params import SamplingParams

HELP = (
    "/reset forget the conversation · /system TEXT set the system message (empty: none) · "
    "/help · /bye or Ctrl-D leave · Ctrl-C stops an answer"
)


def banner(label: str, params: SamplingParams) -> Text:
    """The dim line a terminal conversation opens with: the model, how it samples, the commands.
    A rich ``Text`` styled as a whole, so a ``[...]`` in a model's path prints as itself."""
    return Text(f"chat with {label} · {describe_sampling(params)} · {HELP}", style="dim")


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
    # invalid bytes → U+FFFD with generate -'s warning line
    return decode_utf8(raw, "standard input").removesuffix("\n").removesuffix("\r")


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
    ctx_size: int = 0,
    drafter: Any = None,
) -> ClearLMError | None:
    """Stream one answer to the last user message and keep it; on Ctrl-C or an error (a
    conversation past the context: -c or the model's) the unanswered message is dropped so the
    conversation stays well formed. With ``--compile``, the answer whose first step built the
    compiled step gives that time apart on its stats. Returns the error of a failed turn (it
    is printed here), else None."""
    compiled_before = compile_seconds(model)
    try:
        ids = model.chat_prompt(conv.messages(), parse_special_in_content)
        result, _ = generate_within(
            model, ids, params, max_new_tokens, stop, write_out, ctx_size, None, drafter
        )
    except KeyboardInterrupt:
        conv.turns.pop()
        write_out("\n")
        err.print("[yellow]answer stopped; that message was not kept[/]")
        return None
    except ClearLMError as e:
        conv.turns.pop()
        err.print(f"[red]error:[/] {e} (/reset starts a new conversation)", soft_wrap=True)
        return e
    write_out("\n")
    conv.turns.append({"role": "assistant", "content": result.text})
    if not quiet:
        built = compile_seconds(model) if compiled_before is None else None  # built in this turn
        print_stats(result, context_limit(model.config.context_length, ctx_size)[0], built)
    return None


def run_repl(
    model: Model,
    params: SamplingParams,
    max_new_tokens: int,
    stop: Sequence[str],
    system: str | None,
    parse_special_in_content: bool = False,
    quiet: bool = False,
    label: str | None = None,
    ctx_size: int = 0,
    drafter: Any = None,
) -> int:
    """Read messages until end of input or /bye, answering each with the whole history
    (message text stays text unless ``parse_special_in_content``, see Model.chat_prompt);
    ``quiet`` leaves out the banner and each answer's stats line. ``label``: the model as the
    banner names it (its alias; default the file's path); ``ctx_size``: -c; ``drafter``:
    speculative decoding for every answer (clearlm.cli.speculative).

    Returns the exit status: 0, or, for lines read from a pipe (not a terminal), the exit code
    of the first turn that failed (a script learns that an answer is missing)."""
    interactive = sys.stdin.isatty()
    conv = Conversation(system)
    status = 0
    if interactive:
        try:  # line editing and ↑ history for input()
            import readline  # noqa: F401
        except ImportError:  # not on every platform; input() still works
            pass
        if not quiet:
            err.print(banner(label or str(model.path), params), soft_wrap=True)
    while True:
        try:
            line = _read_line(interactive)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line, keep going
            write_out("\n")
            continue
        if line is None:
            return status
        if not line.strip():
            continue
        if line.startswith("/"):
            if not _command(line, conv):
                return status
            continue
        conv.turns.append({"role": "user", "content": line})
        try:
            failure = _answer(model, conv, params, max_new_tokens, stop,
                              parse_special_in_content, quiet, ctx_size, drafter)  # fmt: skip
            if failure is not None and not interactive and status == 0:
                status = failure.exit_code
        except KeyboardInterrupt:  # Ctrl-C just outside the generation: keep turns paired
            if conv.turns and conv.turns[-1]["role"] == "user":
                conv.turns.pop()
            write_out("\n")


def conversation(
    model_name: str | None,
    dtype: str,
    system: str | None,
    max_new_tokens: int,
    stop: list[str] | None,
    sampling: dict[str, Any],
    parse_special_in_content: bool = False,
    threads: int | None = None,
    quiet: bool = False,
    placement: Placement | None = None,
    weights: str | None = None,
    matmul_precision: str = "highest",
    activations: str = "float32",
    decode: str = "eager",
    ctx_size: int = 0,
    spec: dict[str, Any] | None = None,
) -> None:
    """Load once (chat template checked first), then the read-answer loop of :func:`run_repl`
    (``decode``: the decode mode of every answer, as generate's: clearlm.api.decode; ``spec``:
    the speculative options, as generate's). Sampling: the user's options over
    clearlm.sampling.defaults.chat_defaults for the model."""
    from clearlm.cli.gen_options import check_before_load
    from clearlm.cli.speculative import check_speculative, load_drafter
    from clearlm.sampling.defaults import CHAT_DEFAULTS, chat_defaults  # (no torch)

    stop = check_before_load(model_name, sampling, CHAT_DEFAULTS, stop)
    spec = spec or dict(draft=None, prompt_lookup=False, num_draft=None)
    check_speculative(**spec, compiled=decode == "compiled")
    given = {k: v for k, v in sampling.items() if v is not None}
    m = load_model(
        model_name, dtype, threads, quiet,
        check=lambda h: h.chat_prompt([{"role": "user", "content": "hi"}]), chat=True,
        placement=placement,
        weights=weights, matmul_precision=matmul_precision, activations=activations,
    )  # fmt: skip
    warn_past_model(m.config.context_length, ctx_size)
    drafter = load_drafter(m, **spec, quiet=quiet, dtype=dtype, threads=threads, weights=weights,
                           matmul_precision=matmul_precision, activations=activations)
    if drafter is None:  # (speculative answers verify in k-token passes)
        set_decode(m, decode, quiet)
    params = m.sampling_params(None, chat_defaults(m.generation_defaults, given), **given)
    status = run_repl(m, params, max_new_tokens, stop, system, parse_special_in_content, quiet,
                      model_label(model_name), ctx_size, drafter)  # fmt: skip
    if status:  # a piped conversation with a failed turn (its error line is printed)
        raise typer.Exit(status)


def describe_sampling(params: SamplingParams) -> str:
    """The sampling settings in words, for the conversation's banner: "temperature 0.8 · top-k
    40 · top-p 0.9 · repetition penalty 1.1" (the settings that are not off), or "greedy"
    (then only the repetition penalty applies)."""
    filters = () if params.is_greedy else (
        ("top-k", params.top_k, 0), ("top-p", params.top_p, 1.0), ("min-p", params.min_p, 0.0)
    )  # fmt: skip
    said = ["greedy" if params.is_greedy else f"temperature {params.temperature:g}"]
    for name, value, off in (*filters, ("repetition penalty", params.repetition_penalty, 1.0)):
        if value != off:
            said.append(f"{name} {value:g}")
    return " · ".join(said)
