"""The JSON API behind ``clearlm ui``: every number equals the public API's own."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

import clearlm
from clearlm.inspect.sampling_explain import explain_sampling
from clearlm.sampling.chain import SamplingParams, filter_logits, softmax
from clearlm.ui import create_app

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(smollm2) -> TestClient:
    return TestClient(create_app(smollm2))


def test_page_and_info(client, smollm2):
    page = client.get("/")
    assert page.status_code == 200 and "<canvas" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no external resources
    info = client.get("/api/info").json()
    assert info["n_layers"] == smollm2.config.n_layers
    assert info["n_heads"] == smollm2.config.n_heads


def test_analyze_tokens_lens_distribution(client, smollm2):
    r = client.post("/api/analyze", json={"prompt": PROMPT})
    assert r.status_code == 200
    a = r.json()
    ids = smollm2.tokenizer.encode(PROMPT)
    assert [t["id"] for t in a["tokens"]] == ids
    assert [t["text"] for t in a["tokens"]] == [smollm2.tokenizer.decode([i]) for i in ids]

    # one forward pass: the distribution is the trace's, softmax of the logits the sampling
    # chain reads; the same as next_token_distribution's (which projects only the last
    # position) to the last bits of float32
    dist = smollm2.run_with_trace(PROMPT, ["logits"]).probs[-1]  # (V,)
    assert torch.allclose(dist, smollm2.next_token_distribution(PROMPT), rtol=0, atol=1e-6)
    p, idx = torch.topk(dist, len(a["distribution"]))
    assert [d["id"] for d in a["distribution"]] == idx.tolist()
    assert [d["p"] for d in a["distribution"]] == pytest.approx(p.tolist(), abs=0)
    assert a["distribution"][0]["label"] == " Paris"

    lens = smollm2.logit_lens(PROMPT)  # (N + 1, V)
    assert len(a["lens"]) == smollm2.config.n_layers + 1
    for row, expected in zip(a["lens"], lens, strict=True):
        p, idx = torch.topk(expected, 3)
        assert [t["id"] for t in row["top"]] == idx.tolist()
        assert [t["p"] for t in row["top"]] == pytest.approx(p.tolist(), abs=0)


@pytest.mark.parametrize(("layer", "head"), [(0, 0), (7, 4), (29, 8)])
def test_attention_equals_run_with_trace(client, smollm2, layer, head):
    r = client.post("/api/attention", json={"prompt": PROMPT, "layer": layer, "head": head})
    assert r.status_code == 200
    got = torch.tensor(r.json()["pattern"])  # (T, T)
    trace = smollm2.run_with_trace(PROMPT, [f"blocks.{layer}.attn.pattern"])
    assert torch.equal(got, trace[f"blocks.{layer}.attn.pattern"][0, head].float())


@pytest.mark.parametrize(
    "settings",
    [
        {"top_k": 3},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.3, "min_p": 0.05, "top_k": 40},
        {"temperature": 0.0},
        {"repetition_penalty": 1.3, "top_k": 5},
    ],
)
def test_sampling_equals_explain_sampling(client, smollm2, settings):
    r = client.post("/api/sampling", json={"prompt": PROMPT, "top": 10, **settings})
    assert r.status_code == 200, r.text
    s = r.json()
    params = SamplingParams(**{"seed": 0, **settings})
    logits = smollm2.logits(PROMPT)[-1]
    history = torch.tensor(smollm2.tokenizer.encode(PROMPT))
    why = explain_sampling(logits, history, params, top=10)
    assert [(row["step"], row["kept"]) for row in s["steps"]] == [
        (step.name, len(step.kept)) for step in why.steps
    ]
    z = filter_logits(logits, history, params)  # what the sampler draws from
    if params.is_greedy:
        assert s["kept"] == 1 and s["survivors"][0]["id"] == int(torch.argmax(logits))
    else:
        assert s["kept"] == int((~torch.isneginf(z)).sum()) == len(why.steps[-1].kept)
        assert [(t["id"], t["p"]) for t in s["survivors"]] == list(why.steps[-1].top)
        after = softmax(z)
        for c in s["candidates"]:
            assert c["kept"] == (not torch.isneginf(z[c["id"]]).item())
            assert c["p_after"] == pytest.approx(float(after[c["id"]]))
    if settings == {"top_k": 3}:
        assert s["kept"] == 3 and [c["kept"] for c in s["candidates"][:4]] == [1, 1, 1, 0]


def test_sample_appends_the_drawn_token(client, smollm2):
    body = {"prompt": PROMPT, "temperature": 0.8, "top_k": 5, "seed": 7}
    r = client.post("/api/sample", json=body)
    assert r.status_code == 200
    out = r.json()
    params = SamplingParams(temperature=0.8, top_k=5, seed=7)
    history = torch.tensor(smollm2.tokenizer.encode(PROMPT))
    token = explain_sampling(smollm2.logits(PROMPT)[-1], history, params).token
    assert out["token"]["id"] == token
    assert out["prompt"] == PROMPT + smollm2.tokenizer.decode([token])
    greedy = client.post("/api/sample", json={"prompt": PROMPT, "temperature": 0}).json()
    assert greedy["prompt"] == PROMPT + " Paris"


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/api/analyze", {"prompt": ""}, 400, "the prompt is empty"),
        ("/api/analyze", {"prompt": "   "}, 400, "the prompt is empty"),
        ("/api/analyze", {"prompt": "word " * 900}, 400, "the page takes at most"),
        ("/api/analyze", {"prompt": "a b " * 300}, 400, "tokens; the page shows at most 256"),
        ("/api/analyze", {}, 422, "prompt: Field required"),
        ("/api/attention", {"prompt": PROMPT, "layer": 30}, 400, "layer 30 is out of range"),
        ("/api/attention", {"prompt": PROMPT, "head": -1}, 400, "head -1 is out of range"),
        ("/api/sampling", {"prompt": PROMPT, "top_k": -1}, 400, "top_k must be an integer >= 0"),
        ("/api/sampling", {"prompt": PROMPT, "top_k": "three"}, 422, "top_k: Input should be"),
        ("/api/sampling", {"prompt": PROMPT, "top_p": 0}, 400, "top_p must be in (0, 1]"),
        ("/api/sampling", {"prompt": PROMPT, "min_p": 2}, 400, "min_p must be in"),
        ("/api/sampling", {"prompt": PROMPT, "temperature": -1}, 400, "temperature must be"),
        ("/api/sampling", {"prompt": PROMPT, "top": 0}, 422, "top: Input should be"),
        ("/api/sample", {"prompt": "", "top_k": 3}, 400, "the prompt is empty"),
        ("/api/sample", {"prompt": PROMPT, "seed": -5}, 400, "seed"),
    ],
)
def test_bad_input_is_a_4xx_with_a_message(client, path, body, status, message):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_cli_registers_ui():
    from typer.testing import CliRunner

    from clearlm.cli import app

    out = CliRunner().invoke(app, ["ui", "--help"])
    assert out.exit_code == 0 and "--port" in out.output


def test_byte_tokens_show_as_hex_pieces_not_replacement_characters(client, smollm2):
    prompt = "東京の天気"
    a = client.post("/api/analyze", json={"prompt": prompt}).json()
    texts = [t["text"] for t in a["tokens"]]
    assert texts == smollm2.to_str_tokens(prompt)
    assert any(t.startswith("<0x") for t in texts) and "�" not in "".join(texts)
    # the same bytes, spelled out: the pieces put back together are the prompt's UTF-8
    import re

    raw = b"".join(
        bytes([int(m[3:5], 16)]) if re.fullmatch(r"<0x[0-9A-F]{2}>", m) else m.encode()
        for t in texts
        for m in re.split(r"(<0x[0-9A-F]{2}>)", t)
        if m
    )
    assert raw == prompt.encode()


@pytest.fixture(scope="module")
def tiny_client(tmp_path_factory) -> TestClient:
    from tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path_factory.mktemp("ui-tiny") / "tiny.gguf")
    return TestClient(create_app(clearlm.load(path)))


@pytest.mark.parametrize("layer", ["1", True, 1.0])
def test_layer_must_be_a_json_integer(tiny_client, layer):
    """ "layer": "1" and true were silently read as 1."""
    r = tiny_client.post("/api/attention", json={"prompt": "hello", "layer": layer})
    assert r.status_code == 422 and "layer" in r.json()["error"], r.text
    ok = tiny_client.post("/api/attention", json={"prompt": "hello", "layer": 1})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("body", [b"{not json", b"prompt=hi", b'{"prompt": "hi"', b"\xff\xfe"])
def test_unparsable_body_uses_the_error_shape(tiny_client, body):
    for content_type in ("application/json", "application/x-www-form-urlencoded"):
        r = tiny_client.post("/api/analyze", content=body, headers={"content-type": content_type})
        assert 400 <= r.status_code < 500, r.text
        assert set(r.json()) == {"error"} and r.json()["error"], r.text


def test_sampling_still_takes_ints_for_floats(tiny_client):
    r = tiny_client.post("/api/sampling", json={"prompt": "hello", "temperature": 1, "top_p": 1})
    assert r.status_code == 200, r.text
