"""The page's Diff panel (``clearlm ui --diff B``): ``/api/diff`` returns clearlm.diff's own
numbers for the pair (a tiny model against a copy with block 1's FFN scaled, so block 1 is the
first over the threshold), refuses without a second model and on bad input with one message,
and the CLI loads B once, refusing an incomparable pair before the server starts."""

from __future__ import annotations

import math

import pytest
import torch
import uvicorn
from fastapi.testclient import TestClient
from serve_helpers import free_port
from tiny_gguf import write_tiny_llama
from typer.testing import CliRunner

import clearlm
from clearlm.cli.app import app as cli
from clearlm.inspect.analysis import MAX_PROMPT_CHARS
from clearlm.inspect.diff import ModelsDifferError
from clearlm.ui import create_app
from clearlm.ui.diff import NO_DIFF

TEXT = "hello world, hello there: a small text"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 3-block tiny model (float32 weights)."""
    return write_tiny_llama(tmp_path_factory.mktemp("uidiff") / "a.gguf", n_layers=3, seed=5)


@pytest.fixture(scope="module")
def pair(tiny):
    a, b = clearlm.load(tiny), clearlm.load(tiny)
    with torch.no_grad():
        b.transformer.layers[1].mlp.down_proj.weight.mul_(1.5)
    return a, b


@pytest.fixture(scope="module")
def client(pair) -> TestClient:
    a, b = pair
    return TestClient(create_app(a, title="a.gguf", diff=b, diff_title="b.gguf"))


def assert_same(got, want, where="") -> None:
    """JSON values equal, floats to 1e-9 relative (two runs of the same float32 passes)."""
    if isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12), (where, got, want)
    else:
        assert got == want, where


def test_diff_returns_clearlm_diffs_numbers(client, pair):
    info = client.get("/api/info").json()
    assert info["model"] == "a.gguf" and info["diff"] == "b.gguf"
    r = client.post("/api/diff", json={"text": TEXT})
    assert r.status_code == 200, r.text
    got = r.json()
    want = clearlm.diff(*pair, TEXT).to_dict()
    assert got.pop("model_a") == "a.gguf" and got.pop("model_b") == "b.gguf"
    assert_same(got, want)
    assert got["first_layer"] == 1 and got["threshold"] == 0.01
    assert got["layers"][0]["resid_post"]["max"] == 0.0  # before the scaled block: equal
    assert got["layers"][1]["ffn.out"]["max"] == pytest.approx(0.5, rel=1e-5)  # ‖a − 1.5a‖/‖a‖
    assert got["tokens"] == pair[0].encode(TEXT)
    assert got["perplexity"]["a"] != got["perplexity"]["b"]


def test_the_threshold_is_the_requests(client, pair):
    """At block 1's largest error the first layer over it is a later block (or none): the one
    clearlm.diff finds at that threshold."""
    base = client.post("/api/diff", json={"text": TEXT}).json()
    t = base["layers"][1]["resid_post"]["max"]
    got = client.post("/api/diff", json={"text": TEXT, "threshold": t}).json()
    assert got["threshold"] == t
    assert got["first_layer"] == clearlm.diff(*pair, TEXT, threshold=t).first_layer != 1


def test_without_a_second_model_the_panel_says_how(pair):
    page = TestClient(create_app(pair[0]))
    assert page.get("/api/info").json()["diff"] is None
    r = page.post("/api/diff", json={"text": TEXT})
    assert r.status_code == 400 and r.json() == {"error": NO_DIFF}
    assert "clearlm ui -m MODEL --diff B" in NO_DIFF
    html = page.get("/").text
    for needle in ('id="d-text"', 'id="d-heat"', '"/api/diff"', "--diff B"):
        assert needle in html


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"text": "  "}, 400, "the prompt is empty"),
        ({"text": "x" * (MAX_PROMPT_CHARS + 1)}, 400, f"the page takes at most {MAX_PROMPT_CHARS}"),
        ({"text": "ab " * 40}, 400, "tokens; the page shows at most 63"),
        ({"text": TEXT, "threshold": -1}, 422, "threshold: Input should be greater than or equal"),
        ({"text": 5}, 422, "text: Input should be a valid string"),
        ({"text": TEXT, "points": "x"}, 422, "points: Extra inputs are not permitted"),
    ],
)
def test_bad_input_is_one_message(client, body, status, message):
    r = client.post("/api/diff", json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"] and "\n" not in r.json()["error"]


@pytest.fixture
def no_server(monkeypatch):
    """uvicorn's run replaced: the app the CLI would serve is kept, nothing listens."""
    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(self))
    return served


def test_cli_loads_the_second_model_once(tiny, no_server):
    """--diff with --diff-dtype: the page compares float32 A with bfloat16 B, as clearlm.diff."""
    args = ["ui", "-m", str(tiny), "--diff", str(tiny), "--diff-dtype", "bfloat16", "-q"]
    run = CliRunner().invoke(cli, [*args, "--port", str(free_port())])
    assert run.exit_code == 0, run.output
    page = TestClient(no_server[0].config.app)
    assert page.get("/api/info").json()["diff"] == "a.gguf"
    got = page.post("/api/diff", json={"text": TEXT}).json()
    want = clearlm.diff(tiny, tiny, TEXT, dtype=("float32", "bfloat16")).to_dict()
    assert_same({k: v for k, v in got.items() if not k.startswith("model_")}, want)
    assert want["layers"][0]["resid_post"]["max"] > 0  # bfloat16 moves every block


def test_cli_refuses_an_incomparable_pair_before_serving(tiny, tmp_path, no_server):
    other = write_tiny_llama(tmp_path / "b.gguf", n_layers=2)
    port = free_port()
    run = CliRunner().invoke(cli, ["ui", "-m", str(tiny), "--diff", str(other), "-q",
                                   "--port", str(port)])  # fmt: skip
    assert isinstance(run.exception, ModelsDifferError) and not no_server
    assert str(run.exception) == (
        "the models differ in number of blocks (3 vs 2): diff compares two versions of one "
        "model (quantizations, weights, dtypes), not different models"
    )
    with __import__("socket").socket() as s:  # the port was let go
        s.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--diff-weights", "compact"], "--diff-weights is for the second model: give --diff"),
        (["--diff", "b", "--diff-dtype", "float64"], "'float64' is not one of float32"),
        (["--server", "http://x", "--diff", "b"], "leave --server out"),
    ],
)
def test_cli_usage_errors(args, message):
    run = CliRunner().invoke(cli, ["ui", *args], env={"COLUMNS": "300"})
    assert run.exit_code == 2 and message in run.output, run.output
