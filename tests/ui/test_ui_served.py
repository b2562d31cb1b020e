"""``clearlm ui --server``: the page for a completion a ``clearlm serve --inspect`` answered. Its
route passes the server's answer through unchanged (with the key it was given), refusals as
``{"error"}`` with the server's status; and in headless Chromium the page draws that answer:
one chip per generated token, the alternatives and the lens at the chosen token, the lens
grid over the whole answer."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from serve_helpers import free_port, serving
from tiny_gguf import write_tiny_llama
from typer.testing import CliRunner

import clearlm
from clearlm.cli.app import app as cli
from clearlm.serve import create_app
from clearlm.serve.inspect_store import InspectStore
from clearlm.ui.served import create_served_app

KEY = "secret"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(serve's base URL, a completion id made with KEY) on a tiny model."""
    model = clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("u") / "t.gguf"))
    app = create_app(model, model_id="tiny", api_key=KEY, inspect=InspectStore())
    with serving(app) as url:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True,
                "temperature": 0}  # fmt: skip
        r = httpx.post(f"{url}/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
        yield url.removesuffix("/v1"), r.json()["id"]


def test_route_passes_the_servers_answer(served):
    base, cid = served
    page = TestClient(create_served_app(base + "/v1/", KEY))  # /v1 and a slash are accepted
    html = page.get("/").text
    assert 'id="grid"' in html and "http://" not in html and "https://" not in html
    assert page.get("/api/info").json() == {"server": base}
    got = page.get(f"/api/served/{cid}", params={"top": 3, "layers": "0"})
    want = httpx.get(f"{base}/v1/inspect/{cid}", params={"top": 3, "layers": "0"},
                     headers={"Authorization": f"Bearer {KEY}"}, timeout=60)  # fmt: skip
    assert got.status_code == 200 and got.json() == want.json()
    assert len(got.json()["tokens"]) == 4
    missing = page.get("/api/served/cmpl-nope")
    assert missing.status_code == 404 and "cmpl-nope" in missing.json()["error"]
    wrong_key = TestClient(create_served_app(base, "other")).get(f"/api/served/{cid}")
    assert wrong_key.status_code == 401 and "API key" in wrong_key.json()["error"]
    gone = TestClient(create_served_app(f"http://127.0.0.1:{free_port()}", KEY))
    r = gone.get(f"/api/served/{cid}")
    assert r.status_code == 502 and "cannot reach the server" in r.json()["error"]


def test_cli_refuses_mixed_options():
    run = CliRunner().invoke(cli, ["ui", "--server", "ftp://x", "--port", str(free_port())])
    assert run.exit_code != 0 and "serve address" in run.output
    run = CliRunner().invoke(cli, ["ui", "--server", "http://x", "--model", "m"])
    assert run.exit_code != 0 and "leave --model out" in run.output
    run = CliRunner().invoke(cli, ["ui", "--id", "cmpl-1"])
    assert run.exit_code != 0 and "give --server too" in run.output


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make test)")
def test_page_draws_the_completion(served, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_ui_browser import FLAGS

    base, cid = served
    with serving(create_served_app(base, KEY)) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 1000},
        )  # fmt: skip
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(url.removesuffix("/v1") + f"/?id={cid}")  # opens the id by itself
        page.wait_for_function("() => document.querySelectorAll('#tokens .tok').length === 4")
        want = httpx.get(f"{base}/v1/inspect/{cid}", timeout=60,
                         headers={"Authorization": f"Bearer {KEY}"}).json()  # fmt: skip
        ids = page.eval_on_selector_all("#tokens .tok", "es => es.map(e => +e.dataset.id)")
        assert ids == [t["id"] for t in want["tokens"]]
        alts = page.eval_on_selector_all("#alts tbody tr", "rs => rs.map(r => +r.dataset.id)")
        assert alts == [a["id"] for a in want["tokens"][0]["top"]]
        assert page.locator("#lens tbody tr").count() == len(want["layers"])
        assert page.locator("#grid tbody tr").count() == len(want["layers"])
        page.click("#tokens .tok >> nth=2")
        assert "token 2" in page.text_content("#alts-title")
        page.fill("#cid", "cmpl-nope")
        page.click("#open")
        page.wait_for_function("() => document.querySelector('#error').textContent !== ''")
        assert "cmpl-nope" in page.text_content("#error")
        browser.close()
