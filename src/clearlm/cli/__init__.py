"""The ``clearlm`` command. One module per group of commands: generation (generate, chat),
inspection (info, perplexity), model management (pull, models, rm), the explanations
(walkthrough, explain, ui, diff), serving (serve), and ollama's spellings (run: chat; list:
models).
``--help`` lists them in that order.

Every mistake ends as one line ``error: ...`` on stderr and a non-zero exit code: 2 for
command-line usage (an unknown option, a missing argument, a value of the wrong type), else
the ClearLMError's own code (see clearlm.errors). Tracebacks are for bugs only.

The top layer: it may import every package. ``loader.py`` loads a model with the loading
line and spinner, ``gen_options.py`` declares the generation options once for generate and
chat.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import NoReturn

import typer
from rich.markup import escape

from clearlm.cli.app import DType, ModelOpt, app, err
from clearlm.errors import ClearLMError, printable

__all__ = ["DType", "ModelOpt", "app", "err", "main"]


def _stdout_closed(status: int = 0) -> NoReturn:
    """stdout takes no more output: its reader went away (``clearlm info | head -2``: status
    0, nothing said) or a write failed (``> /dev/full``: the caller said why, status 1). stdout
    is pointed at /dev/null so the interpreter's last flush cannot fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(status)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """clearlm's own warnings (``clearlm: ...``) as one ``warning:`` line, like the CLI's;
    anyone else's as Python prints them."""
    text = str(message)
    if text.startswith("clearlm: "):
        err.print(f"[yellow]warning: {escape(printable(text.removeprefix('clearlm: ')))}[/]",
                  soft_wrap=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def main() -> None:
    """Entry point: run the app; every failure becomes one line on stderr and an exit code;
    a closed stdout pipe, for any command, ends with status 0 and nothing on stderr."""
    warnings.showwarning = _show_warning
    try:
        code = app(standalone_mode=False)
        sys.stdout.flush()  # what is still buffered: a closed pipe shows here, not at exit
    except SystemExit as e:
        # rich (Console.on_broken_pipe) and typer's click turn a closed stdout into exit 1:
        # the BrokenPipeError behind the exit, or click's PacifyFlushWrapper, is the sign
        closed = isinstance(e.__context__, BrokenPipeError)
        if closed or "PacifyFlushWrapper" in type(sys.stdout).__name__:
            _stdout_closed()
        raise e from None
    except typer.Abort:
        err.print("interrupted")
        sys.exit(130)
    except typer.TyperException as e:  # typer's click: usage errors and the no-argument help
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:
            # its message is the help: empty where typer's rich help printed itself already
            if help_text := e.format_message():
                print(help_text)
            sys.exit(0)
        name = ctx.command_path if ctx is not None else "clearlm"
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        message = escape(printable(message))  # a value may hold control chars or [markup]
        err.print(f"[red]error:[/] {message} (see '{name} --help')", soft_wrap=True)
        sys.exit(getattr(e, "exit_code", 2))
    except ClearLMError as e:
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        sys.exit(e.exit_code)
    except BrokenPipeError:  # the reader went away (e.g. `| head`): nothing left to say
        _stdout_closed()
    except OSError as e:  # e.g. stdout on a full disk (`> /dev/full`): one line, not a traceback
        err.print(f"[red]error:[/] {escape(printable(str(e)))}", soft_wrap=True)
        _stdout_closed(1)
    sys.exit(code if isinstance(code, int) else 0)


# Importing a module registers its commands; --help lists them in this order.
from clearlm.cli import generate, inspect, manage  # noqa: E402,F401,I001
from clearlm.cli import explain, patch, ui, walkthrough  # noqa: E402,F401
from clearlm.cli import diff  # noqa: E402,F401
from clearlm.cli import serve  # noqa: E402,F401
from clearlm.cli import compile  # noqa: E402,F401  (listed after the everyday commands)
from clearlm.cli import ollama  # noqa: E402,F401  (run, list: ollama's spellings)
