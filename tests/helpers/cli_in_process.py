"""`python -m clearlm ARGS` run inside the test process: the same entry point
(clearlm.cli.main, with its one-line errors and exit codes), standard input given as bytes,
standard output and error caught as bytes, the environment overridden for the call.

A subprocess spends ~2.5 s importing torch and clearlm before it does anything; tests that
check what a command prints or returns, and not how a process behaves (signals, pipes closed
early, real terminals), run it here instead. What the command changes in the process is put
back after it: torch's thread count, the warnings hook, sys.argv.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import torch
from click.testing import CliRunner


def run_clearlm(
    *args: str, stdin: bytes | None = None, text: bool = False, **env: str
) -> subprocess.CompletedProcess:
    """Run ``clearlm ARGS`` here; returns what ``subprocess.run([..., "-m", "clearlm", *args],
    input=stdin, capture_output=True, text=text)`` would: returncode, stdout and stderr as
    bytes (text: as str, decoded from UTF-8)."""
    from clearlm.cli import main

    threads, show, argv = torch.get_num_threads(), warnings.showwarning, sys.argv
    code: int = 0
    try:
        with CliRunner().isolation(input=stdin or b"", env=env) as (out, err, _):
            sys.argv = ["clearlm", *args]
            try:
                main()
            except SystemExit as e:  # main() ends every failure with sys.exit(code)
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    sys.stderr.write(e.code + "\n")
            sys.stdout.flush()
            sys.stderr.flush()
            stdout, stderr = out.getvalue(), err.getvalue()
    finally:
        torch.set_num_threads(threads)
        warnings.showwarning, sys.argv = show, argv
    if text:
        stdout, stderr = stdout.decode(), stderr.decode()
    return subprocess.CompletedProcess(["clearlm", *args], code, stdout, stderr)
