"""The documentation as a user pastes it: every fenced block of README.md and docs/*.md whose
language is ``bash``, ``sh``, ``python`` or none is run, or says why not.

- Shell lines that call ``clearlm`` run against the real default model, each once however many
  pages show it, in a scratch folder holding the files the examples name (``notes.txt``,
  ``path/to/model.gguf``, ``tests/data/``); a line naming a model that is not pulled skips.
- ``curl`` lines, and Python blocks that talk to ``http://127.0.0.1:8000``, run against a server
  of the default model started for them (the address replaced by the server's).
- A page's other Python blocks run in order in one fresh interpreter, as a reader pasting them
  one after the other would.
- A block that must not run (it starts a server that runs until stopped, downloads, needs
  several processes, or is an outline) has ``<!-- not-run: REASON -->`` right before it; every
  such comment must give a reason. Any other line in a shell block fails the test, so a new
  command is either run here or marked.

Output, JSON and outlines of shapes use other languages (``text``, ``json``), which are not run.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from serve_helpers import serving

from clearlm.store.catalog import ALIASES, locate

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL, PYTHON = {"", "bash", "sh"}, {"python"}
LOCAL = "http://127.0.0.1:8000"  # the address the examples use for `clearlm serve`
NOT_RUN = re.compile(r"^\s*<!--\s*not-run\b:?(.*?)-->", re.S | re.M)
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code, and why it is not run (None: run)."""

    page: str
    line: int
    lang: str
    code: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, with the not-run comment right before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = NOT_RUN.search(before)
        reason = mark.group(1).strip() if mark else None
        found.append(Block(path.name, i + 1, lang, code, reason))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]
RUN = [b for b in ALL if b.not_run is None and b.lang in SHELL | PYTHON]


def shell_commands(block: Block) -> list[str]:
    """The block's commands, continuation lines joined, comments and runs of spaces dropped
    (so the same command on two pages runs once)."""
    joined = block.code.replace("\\\n", " ")
    lines = (re.sub(r"(^|\s+)#(\s.*)?$", "", line) for line in joined.splitlines())
    return [" ".join(c.split()) for c in lines if c.strip()]


def is_clearlm(command: str) -> bool:
    return re.search(r"(^|\|\s*)clearlm\b", command) is not None


COMMANDS = sorted({c for b in RUN if b.lang in SHELL for c in shell_commands(b) if is_clearlm(c)})
CURLS = sorted({c for b in RUN if b.lang in SHELL for c in shell_commands(b) if c[:5] == "curl "})
SERVER_PY = sorted({b.code for b in RUN if b.lang in PYTHON and LOCAL in b.code})
PAGE_PY = sorted({b.page for b in RUN if b.lang in PYTHON and LOCAL not in b.code})


def test_every_block_runs_or_says_why():
    """Each shell line is a clearlm or curl command; each not-run comment gives a reason and
    stands right before a block."""
    assert RUN, "no runnable block found"
    for b in ALL:
        assert b.not_run != "", f"{b.where}: <!-- not-run: ... --> needs a reason"
        if b.not_run is None and b.lang in SHELL:
            for c in shell_commands(b):
                assert is_clearlm(c) or c.startswith("curl "), (
                    f"{b.where}: {c!r} is not run by this test; make it a clearlm or curl "
                    "command, or mark the block <!-- not-run: REASON -->"
                )
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in NOT_RUN.finditer(text):
            after = text[m.end() :].lstrip("\n")
            assert FENCE.match(after.splitlines()[0]), f"{page.name}: not-run before no block"


def test_readme_links_to_pages_that_exist():
    """README.md's relative links (to docs/ pages) resolve; mkdocs --strict checks the pages'."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)[^)]*\)", readme)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local and all((ROOT / t).is_file() for t in local), local


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A scratch folder holding the files the examples name, and an environment whose
    ``clearlm`` is this interpreter's ``python -m clearlm``."""
    root = tmp_path_factory.mktemp("docs")
    (root / "notes.txt").write_text("The three primary colours are", encoding="utf-8")
    (root / "path/to").mkdir(parents=True)
    (root / "path/to/model.gguf").symlink_to(locate(ALIASES["smollm2-135m-instruct"]))
    (root / "tests").symlink_to(ROOT / "tests")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "clearlm"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m clearlm "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    return root, env


def skip_unless_pulled(command: str) -> None:
    for name, alias in ALIASES.items():
        if re.search(rf"\b{re.escape(name)}\b", command) and locate(alias) is None:
            pytest.skip(f"{name} is not pulled (clearlm pull {name})")


def run_shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=COMMANDS)
def test_command_runs(command, sandbox):
    skip_unless_pulled(command)
    root, env = sandbox
    proc = run_shell(command, root, env)  # with pipefail: `clearlm ... | head` must exit 0
    assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip(), f"{command} printed nothing"


@pytest.mark.parametrize("page", PAGE_PY)
def test_python_blocks_run_in_order(page, sandbox):
    root, env = sandbox
    code = "\n\n".join(b.code for b in RUN if b.page == page and b.lang in PYTHON
                       and LOCAL not in b.code)  # fmt: skip
    script = root / f"{page}.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"{page}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def server() -> str:
    """http://127.0.0.1:PORT of a server of the default model, as `clearlm serve` makes it."""
    import clearlm
    from clearlm.serve.app import create_app

    model = clearlm.load()
    with serving(create_app(model, model_id="smollm2-135m-instruct")) as url:
        yield url.removesuffix("/v1")


@pytest.mark.parametrize("command", CURLS, ids=CURLS)
def test_curl_against_a_server(command, server, sandbox):
    root, env = sandbox
    proc = run_shell(command.replace(LOCAL, server), root, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and '"error"' not in proc.stdout, proc.stdout[-1000:]


@pytest.mark.parametrize("code", SERVER_PY, ids=lambda c: f"{len(c.splitlines())}-lines")
def test_python_client_against_a_server(code, server, capsys):
    exec(compile(code.replace(LOCAL, server), "snippet", "exec"), {})
    assert "Paris" in capsys.readouterr().out
