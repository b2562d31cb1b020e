"""`clearlm explain`: its numbers equal the traced tensors, pictures draw them, the page is
self-contained, the command runs and rejects bad choices in one line."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from cli_in_process import run_clearlm

from clearlm.errors import ClearLMError
from clearlm.inspect.explain import TEMPERATURES, explain_data
from clearlm.sampling.chain import softmax

PROMPT = "The capital of France is"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def ex(smollm2):
    return explain_data(smollm2, PROMPT, layer=None, head=None, top=5)


@pytest.fixture(scope="module")
def trace(smollm2):
    return smollm2.run_with_trace(PROMPT)


def test_tokens_and_embeddings(ex, trace):
    assert ex.tokens == trace.tokens and ex.text == trace.text
    assert torch.allclose(ex.embed_norms, trace["embed"][0].norm(dim=-1))
    assert ex.position == "rope" and ex.pos_norms is None


def test_attention_focus_is_the_patterns_argsort(ex, trace, smollm2):
    N = smollm2.config.n_layers
    assert ex.layers == (0, N // 2, N - 1) and ex.heads == tuple(range(smollm2.config.n_heads))
    assert len(ex.focus) == len(ex.layers) * len(ex.heads)
    for f in ex.focus:
        row = trace[f"blocks.{f.layer}.attn.pattern"][0, f.head, -1]  # (T,)
        order = torch.argsort(row, descending=True, stable=True)[: len(f.positions)]
        assert list(f.positions) == order.tolist()
        assert torch.allclose(torch.tensor(f.weights), row[order])
    for i in ex.layers:
        assert torch.equal(ex.patterns[i], trace[f"blocks.{i}.attn.pattern"][0])


def test_residual_norms_and_ffn_stats(ex, trace, smollm2):
    for i in range(smollm2.config.n_layers):
        assert torch.isclose(ex.resid_norms[i], trace[f"blocks.{i}.resid_post"][0, -1].norm())
        act = trace[f"blocks.{i}.ffn.act"][0, -1]  # (F,)
        assert torch.isclose(ex.ffn_mean[i], act.mean(), atol=1e-7)
        assert torch.isclose(ex.ffn_std[i], act.std())
        assert float(ex.ffn_positive[i]) == pytest.approx(float((act > 0).float().mean()))


def test_logit_lens_matches_the_model(ex, smollm2):
    lens = smollm2.logit_lens(PROMPT)  # (N + 1, V) at the last position
    p, ids = lens.max(dim=-1)
    assert torch.equal(ex.lens_ids[:, -1], ids)
    assert torch.allclose(ex.lens_probs[:, -1], p, atol=1e-5)
    final = smollm2.next_token_distribution(PROMPT)
    assert int(ex.lens_ids[-1, -1]) == int(final.argmax())
    assert float(ex.lens_probs[-1, -1]) == pytest.approx(float(final.max()), abs=1e-5)


def test_top_probabilities_are_softmax_of_logits(ex, trace, smollm2):
    logits = trace["logits"][0, -1]
    probs = softmax(logits)
    assert torch.equal(ex.logits, logits)
    assert torch.equal(ex.top_ids, torch.sort(probs, descending=True, stable=True).indices[:5])
    assert torch.allclose(ex.probs[ex.top_ids], probs[ex.top_ids])
    assert torch.allclose(ex.temperature_probs[1.0], probs[ex.top_ids])
    assert torch.allclose(ex.temperature_probs[0.5], softmax(logits / 0.5)[ex.top_ids])
    assert smollm2.tokenizer.decode([int(ex.top_ids[0])]) == " Paris"
    greedy = dict(ex.sampling)["greedy (T = 0)"]
    assert greedy.token == int(logits.argmax())
    assert len(dict(ex.sampling)["top-k 5"].steps[-1].kept) == 5


def test_bad_choices_raise(smollm2):
    with pytest.raises(ClearLMError, match="--layer 99 is out of range"):
        explain_data(smollm2, PROMPT, layer=99)
    with pytest.raises(ClearLMError, match="--head 9 is out of range"):
        explain_data(smollm2, PROMPT, head=9)


def test_pictures_draw_the_traced_tensors(ex):
    from clearlm.inspect.plots import attention_png, lens_png, temperature_png

    png, drawn = attention_png(ex)
    assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert set(drawn) == {(i, h) for i in ex.layers for h in ex.heads}
    for (i, h), m in drawn.items():
        assert np.array_equal(m, ex.patterns[i][h].numpy())
    png, drawn = temperature_png(ex)
    assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert list(drawn) == list(TEMPERATURES)
    for t, heights in drawn.items():
        assert np.allclose(heights, softmax(ex.logits / t)[ex.top_ids].numpy())
    png, drawn = lens_png(ex)
    assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert np.array_equal(drawn, ex.lens_probs.numpy())


def test_html_page_is_self_contained(ex):
    from clearlm.inspect.plots import all_pngs
    from clearlm.inspect.report import html_page

    page = html_page(ex, all_pngs(ex))
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page)
    assert "<script" not in page and "<link" not in page
    assert page.count('src="data:image/png;base64,iVBORw0KGgo') == 3
    for t in ex.text:
        assert t.replace(" ", "␣") in page


def test_cli(tmp_path):
    html = tmp_path / "page.html"
    cmd = ["explain", PROMPT, "--layer", "3", "--head", "1"]
    # in this process (clearlm.cli.main): a subprocess spends ~2.5 s importing torch
    r = run_clearlm(*cmd, "--top", "5", "--png", str(tmp_path / "png"), "--html", str(html),
                    text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and r.stdout.count("Stage 5") == 1  # one heading per stage
    assert "wrote" not in r.stdout  # stdout holds only the tables; file notes go to stderr
    assert f"wrote {html}" in r.stderr and str(tmp_path / "png" / "attention.png") in r.stderr
    for name in ("attention.png", "temperature.png", "logit_lens.png"):
        data = (tmp_path / "png" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert "base64" in html.read_text(encoding="utf-8")


@pytest.mark.parametrize("args", [["--layer", "30"], ["--head", "-1"]])
def test_cli_rejects_out_of_range(args):
    r = run_clearlm("explain", PROMPT, *args, text=True)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "out of range" in lines[0]


def test_cjk_prompt_shows_byte_pieces_and_plots_without_glyph_warnings(smollm2, capfd):
    """'東京' is split into byte tokens by SmolLM2: pieces read <0xE6>, never '�'; the pictures
    of CJK labels (a whole character as a label too) draw without matplotlib's warnings."""
    import dataclasses
    import warnings

    from clearlm.inspect.plots import all_pngs
    from clearlm.inspect.report import sections

    prompt = "東京の天気"
    ex = explain_data(smollm2, prompt, layer=0, head=0, top=3)
    assert ex.text == smollm2.to_str_tokens(prompt)
    assert any(t.startswith("<0x") for t in ex.text) and "�" not in "".join(ex.text)
    shown = " ".join(cell for s in sections(ex) for row in s.rows for cell in row)
    assert "�" not in shown
    ex = dataclasses.replace(ex, text=["東", "京", *ex.text[2:]])  # whole characters as labels
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pngs = all_pngs(ex)
    assert all(p.startswith(PNG_MAGIC) for p in pngs.values())
    assert not [w for w in caught if "Glyph" in str(w.message)]
    assert "Glyph" not in capfd.readouterr().err
