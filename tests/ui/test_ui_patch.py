"""The page's activation-patching panel: ``/api/patch`` returns Model.patch's own grid, and
refuses what the API refuses, as one message."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.inspect import analysis
from clearlm.ui import create_app

PAIR = {"clean": "hello world", "corrupted": "hello wormd", "answer": "l", "wrong": "d"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("ui") / "t.gguf", n_layers=3))


@pytest.fixture(scope="module")
def client(tiny) -> TestClient:
    return TestClient(create_app(tiny))


def test_patch_returns_the_apis_grid(client, tiny):
    r = client.post("/api/patch", json={**PAIR, "points": "resid_pre, attn.out"})
    assert r.status_code == 200, r.text
    got = r.json()
    want = tiny.patch(
        PAIR["clean"], PAIR["corrupted"], ["resid_pre", "attn.out"], answer="l", wrong="d"
    ).to_dict()
    names = [f"blocks.{i}.{kind}" for kind in ("resid_pre", "attn.out") for i in range(3)]
    assert got["points"] == want["points"] == names
    assert got["clean_tokens"] == want["clean_tokens"] and got["positions"] == list(range(9))
    assert torch.allclose(torch.tensor(got["recovery"]), torch.tensor(want["recovery"]), atol=1e-6)
    assert got["clean_diff"] == pytest.approx(want["clean_diff"], abs=1e-6)
    # the differing token: patching it back is the clean run, up to float rounding (the patched
    # rows run batched, the clean run alone; seen 2e-5 off on a busy 2-core machine)
    assert got["recovery"][0][7] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"corrupted": "hello"}, 400, "the clean prompt is 9 tokens and the corrupted one 3"),
        ({"answer": "ab"}, 400, "answer 'ab' is 2 tokens"),
        ({"points": "resid_nope"}, 400, "hook point 'resid_nope'"),
        ({"clean": " "}, 400, "the prompt is empty"),
        ({"wrong": None}, 422, "wrong: Input should be a valid string"),
    ],
)
def test_patch_errors_are_one_message(client, change, status, message):
    r = client.post("/api/patch", json={**PAIR, **change})
    assert r.status_code == status
    assert message in r.json()["error"]


def test_a_grid_too_large_for_the_page_is_refused(client, monkeypatch):
    monkeypatch.setattr(analysis, "MAX_PATCH_CELLS", 20)
    r = client.post("/api/patch", json={**PAIR, "points": "resid_pre"})  # 3 × 9 = 27 cells
    assert r.status_code == 400
    assert "the grid has 3 hook points × 9 positions" in r.json()["error"]


def test_the_page_has_the_panel(client):
    page = client.get("/").text
    for needle in ('id="p-clean"', 'id="p-corrupted"', 'id="pheat"', '"/api/patch"'):
        assert needle in page
