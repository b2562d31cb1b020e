"""``clearlm ui`` end to end: the real server, the page in headless Chromium (Playwright).

Uses Debian's Chromium (/usr/bin/chromium, installed by `make test`), never a browser that
Playwright downloads; skips when it is absent.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (make test)"
)
# Without the background-networking flags Chromium keeps calling out, and this network refuses.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PROMPT = "The capital of France is"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(smollm2) -> Iterator[str]:
    """The app served by uvicorn on a free localhost port, in a background thread."""
    import uvicorn

    from clearlm.ui import create_app

    port = _free_port()
    config = uvicorn.Config(create_app(smollm2), host="127.0.0.1", port=port, log_level="warning")
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
    """A Chromium page (Playwright driving /usr/bin/chromium) with a fresh profile."""
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 1400},
        )
        page = browser.new_page()
        page.set_default_timeout(30_000)
        yield page
        browser.close()


def _set_slider(page, name: str, value: float) -> None:
    """Move a range input as a user would: set its value, fire 'input'."""
    page.eval_on_selector(
        f"#{name}",
        "(e, v) => { e.value = v; e.dispatchEvent(new Event('input', {bubbles: true})); }",
        str(value),
    )


def _shown(label: str) -> str:
    return label.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")


def test_prompt_slider_and_screenshot(page, server, tmp_path):
    page.goto(server + "/")
    page.fill("#prompt", PROMPT)
    page.click("#run")
    page.wait_for_function("n => document.querySelectorAll('#tokens .tok').length === n", arg=5)
    api = httpx.post(server + "/api/analyze", json={"prompt": PROMPT}).json()
    shown_ids = page.eval_on_selector_all("#tokens .tok", "es => es.map(e => +e.dataset.id)")
    assert shown_ids == [t["id"] for t in api["tokens"]]
    assert page.locator("#layer option").count() == api["n_layers"]
    assert page.locator("#lens tbody tr").count() == api["n_layers"] + 1

    _set_slider(page, "top_k", 3)
    page.wait_for_function("() => document.querySelector('#kept').dataset.kept === '3'")
    want = httpx.post(server + "/api/sampling", json={"prompt": PROMPT, "top_k": 3}).json()
    survivors = page.eval_on_selector_all(
        "#candidates tbody tr.kept",
        "rs => rs.map(r => [+r.dataset.id, r.cells[0].textContent, r.cells[2].textContent])",
    )
    assert survivors == [
        [t["id"], _shown(t["label"]), f"{100 * t['p']:.2f}%"] for t in want["survivors"]
    ]
    assert survivors[0][1] == "\u2423Paris"
    assert page.locator("#candidates tbody tr.out").count() == len(want["candidates"]) - 3

    page.select_option("#layer", "5")
    page.select_option("#head", "2")
    page.wait_for_timeout(300)
    assert page.eval_on_selector("#heat", "c => c.width") > 100

    shot = tmp_path / "ui.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    Path("/tmp/clearlm-ui.png").write_bytes(data)  # for a person to look at


def test_bad_input_shows_the_servers_message(page):
    _set_slider(page, "top_k", 3)
    _set_slider(page, "top_p", 0)  # the range input clamps to its min, 0.01: still valid
    # Let the sliders' own requests finish first: a late reply to them would clear the message.
    page.wait_for_load_state("networkidle")
    page.fill("#prompt", "")
    page.click("#run")
    page.wait_for_function("() => document.querySelector('#error').textContent.includes('empty')")
    assert "the prompt is empty" in page.text_content("#error")
    # the previous prompt's results are gone: nothing shown belongs to another prompt
    assert page.locator("#tokens .tok").count() == 0
    assert page.locator("#lens tbody tr").count() == 0
    assert page.locator("#candidates tbody tr").count() == 0
    assert page.text_content("#kept") == "" and page.eval_on_selector("#heat", "c => c.width") == 10


def test_sample_appends_a_token(page):
    page.fill("#prompt", PROMPT)
    page.click("#run")
    page.wait_for_function("() => document.querySelector('#error').textContent === ''")
    _set_slider(page, "temperature", 0)
    page.click("#sample")
    page.wait_for_function("p => document.querySelector('#prompt').value !== p", arg=PROMPT)
    assert page.input_value("#prompt") == PROMPT + " Paris"  # greedy
    page.wait_for_function("() => document.querySelectorAll('#tokens .tok').length === 6")


def test_heatmap_legend_and_long_prompts_stay_readable(page, server, smollm2):
    # the legend's ramp runs from white (weight 0) to the colour of weight 1 (sqrt scale)
    ramp = page.eval_on_selector("#ramp", "e => getComputedStyle(e).backgroundImage")
    assert ramp.startswith("linear-gradient") and "rgb(255, 255, 255) 0%" in ramp
    assert "rgb(47, 95, 208) 100%" in ramp  # 255 - (208, 160, 47) at √1 = 1
    long_prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)
    n = len(smollm2.encode(long_prompt))
    assert n > 100
    page.fill("#prompt", long_prompt)
    page.click("#run")
    page.wait_for_function("n => document.querySelectorAll('#tokens .tok').length === n", arg=n)
    # auto zoom: cells big enough for labels (12 px), not 440 / n ≈ 4 px
    page.wait_for_function("() => document.querySelector('#heat').dataset.cell === '12'")
    width, box = page.eval_on_selector("#heatwrap", "w => [w.scrollWidth, w.clientWidth]")
    assert width > box  # the panel scrolls instead of shrinking the picture
    page.select_option("#zoom", "fit")
    page.wait_for_function("() => +document.querySelector('#heat').dataset.cell < 9")
