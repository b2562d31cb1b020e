"""The page's activation-patching panel in headless Chromium (as tests/ui/test_ui_browser.py,
on a tiny model): the grid drawn is /api/patch's, a refused pair shows the server's message."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tiny_gguf import write_tiny_llama

import clearlm

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (make test)"
)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
PAIR = {"clean": "hello world", "corrupted": "hello wormd", "answer": "l", "wrong": "d"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """The page of a tiny 3-block model, served by uvicorn on a free localhost port."""
    import uvicorn

    from clearlm.ui import create_app

    model = clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("pb") / "t.gguf", n_layers=3))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(model), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM),
            headless=True, args=FLAGS, viewport={"width": 1280, "height": 1400},
        )  # fmt: skip
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(server + "/")
        yield page
        browser.close()


def _fill(page, pair: dict[str, str], points: str) -> None:
    for key, value in pair.items():
        page.fill(f"#p-{key}", value)
    page.select_option("#p-points", points)
    page.click("#p-run")


def test_the_panel_draws_the_servers_grid(page, server):
    _fill(page, PAIR, "attn.out")
    page.wait_for_function("() => document.querySelector('#p-status').textContent.includes('×')")
    want = httpx.post(server + "/api/patch", json={**PAIR, "points": "attn.out"}).json()
    status = page.text_content("#p-status")
    assert status.startswith("3 hook points × 9 positions")
    assert f"clean {want['clean_diff']:.3f}, corrupted {want['corrupted_diff']:.3f}" in status
    # the canvas holds 9 cells of 44 px across and 3 of 16 px down, after the labels
    left, top, width, height = page.eval_on_selector(
        "#pheat", "c => [+c.dataset.left, +c.dataset.top, c.width, c.height]"
    )
    assert (width - left, height - top) == (9 * 44 + 2, 3 * 16 + 2)
    # the cell of block 1 at position 7 is coloured as its recovery says (white 0, blue 1)
    v = want["recovery"][1][7]
    pixel = page.evaluate(
        "([x, y]) => Array.from(document.querySelector('#pheat').getContext('2d')"
        ".getImageData(x, y, 1, 1).data.slice(0, 3))",
        [left + 7 * 44 + 3, top + 1 * 16 + 2],
    )
    t = max(-1.0, min(1.0, v))
    expected = [255 - 208 * t, 255 - 160 * t, 255 - 47 * t] if t >= 0 else [
        255 + 75 * t, 255 + 220 * t, 255 + 231 * t]  # fmt: skip
    assert pixel == pytest.approx(expected, abs=1.5)
    page.hover("#pheat", position={"x": left + 7 * 44 + 20, "y": top + 1 * 16 + 8})
    assert page.text_content("#p-hover").startswith("blocks.1.attn.out at 7 ")


def test_a_refused_pair_shows_the_message_and_clears_the_grid(page):
    _fill(page, {**PAIR, "corrupted": "hello"}, "resid_pre")
    page.wait_for_function("() => document.querySelector('#p-error').textContent !== ''")
    assert "the clean prompt is 9 tokens and the corrupted one 3" in page.text_content("#p-error")
    assert page.eval_on_selector("#pheat", "c => c.width") == 10
    assert page.text_content("#p-status") == ""
