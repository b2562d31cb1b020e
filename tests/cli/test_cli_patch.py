"""``clearlm patch`` on a tiny model: the table, --json and --plot show Model.patch's grid;
mistakes are one line and a non-zero exit."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.cli import main

ARGS = ["--clean", "hello world", "--corrupted", "hello wormd", "--answer", "l", "--wrong", "d"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("cli-patch") / "tiny.gguf")


@pytest.fixture
def cli(monkeypatch, capsys):
    """``clearlm patch ARGS`` in this process (main(), as the console script runs it): (exit
    code, stdout, stderr). The torch threads stay as they are."""

    def run(*args: str) -> tuple[int, str, str]:
        threads = str(torch.get_num_threads())
        monkeypatch.setattr(sys, "argv", ["clearlm", "patch", *args, "--threads", threads])
        with pytest.raises(SystemExit) as e:
            main()
        out = capsys.readouterr()
        return e.value.code, out.out, out.err

    return run


def test_table_json_and_plot(cli, tiny, tmp_path):
    want = clearlm.load(tiny, weights="float32").patch(
        "hello world", "hello wormd", ["resid_pre", "blocks.1.ffn.out"], [0, 7, -1],
        answer="l", wrong="d",
    )  # fmt: skip
    png = tmp_path / "pics" / "grid.png"
    common = [*ARGS, "-m", str(tiny), "--weights", "float32", "--points",
              "resid_pre,blocks.1.ffn.out", "--positions", "0,7,-1"]  # fmt: skip
    code, out, err = cli(*common, "--plot", str(png), "-q")
    assert code == 0, err
    assert out.strip() == want.table()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = cli(*common, "--json", "-q")
    assert code == 0, err
    got = json.loads(out)
    assert got["points"] == ["blocks.0.resid_pre", "blocks.1.resid_pre", "blocks.1.ffn.out"]
    assert got["positions"] == [0, 7, 8] and got["model"] == str(tiny)
    np.testing.assert_allclose(got["recovery"], want.recovery.numpy(), atol=1e-6)
    assert got["recovery"][0][1] == pytest.approx(1.0, abs=1e-5)  # the token that differs


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--corrupted", "hello"], 1, "error: the clean prompt is 9 tokens and the corrupted one"),
        (["--answer", "ab"], 1, "error: answer 'ab' is 2 tokens"),
        (["--points", "blocks.5.resid_pre"], 1, "hook point 'blocks.5.resid_pre'"),
        (
            ["--points", "resid_pre,blocks.0.hook_resid_pre"],
            1,
            "error: hook point 'blocks.0.resid_pre' is named more than once",
        ),
        (["--positions", "1,x"], 2, "'1,x' is not a list of positions"),
    ],
)
def test_mistakes_are_one_line(cli, tiny, extra, code, message):
    got, out, err = cli(*ARGS, *extra, "-m", str(tiny))
    assert got == code
    assert message in err and len(err.strip().splitlines()) == 1
    assert out == ""


def test_answer_is_text_on_the_command_line(cli, tiny):
    """The CLI reads --answer as text: its message does not offer an id."""
    got, out, err = cli(*ARGS, "--answer", "100", "-m", str(tiny))
    assert got == 1 and err.startswith("error: answer '100' is 3 tokens (1|0|0); give one token")
    assert "id" not in err and len(err.strip().splitlines()) == 1


def test_the_heat_map_draws_the_grid(tiny):
    from clearlm.inspect.patch_plot import recovery_png

    r = clearlm.load(tiny).patch("hello world", "hello wormd", "attn.out", answer="l", wrong="d")
    png, drawn = recovery_png(r)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000
    np.testing.assert_array_equal(drawn, r.recovery.numpy())
