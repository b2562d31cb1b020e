"""``clearlm serve --inspect`` and ``GET /v1/inspect/{id}``: the kept ids are the response's,
every probability is the model's own (computed again here, independently), the logit lens is
``Model.logit_lens``'s, and what may not be read is refused in OpenAI's error shape: inspection
off, an unknown id, another API key, a completion the store has dropped."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.cli.serve import INSPECT_KEEP, INSPECT_TTL_S
from clearlm.serve import create_app
from clearlm.serve.inspect_store import DEFAULT_KEEP, DEFAULT_TTL_S, InspectStore, key_digest

MODEL = "tiny"
PROMPT = [72, 101, 108, 108, 111, 32]  # "Hello " as byte tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    path = write_tiny_llama(tmp_path_factory.mktemp("i") / "t.gguf", context_length=64)
    return clearlm.load(path)


@pytest.fixture(scope="module")
def url(tiny):
    with serving(create_app(tiny, model_id=MODEL, inspect=InspectStore(keep=4))) as u:
        yield u


def completion(url: str, key: str | None = None, **body) -> dict:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, **body}
    r = httpx.post(f"{url}/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def inspect(url: str, cid: str, key: str | None = None, **query) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{url}/inspect/{cid}", params=query, headers=headers, timeout=60)


def check_error(r: httpx.Response, status: int, code: str, needle: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == code and needle in err["message"], err


def test_tokens_and_probabilities_are_the_models_own(url, tiny):
    # temperature 1 and no filter: the engine samples from the model's own distribution, so the
    # response's logprobs are a second, independent witness of the inspected probabilities
    answer = completion(url, n=2, seed=3, temperature=1.0, top_p=1.0, logprobs=1)
    r = inspect(url, answer["id"], choice=1, top=3)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["id"] == answer["id"] and view["choices"] == 2 and view["choice"] == 1
    assert [t["id"] for t in view["prompt_tokens"]] == PROMPT
    tokens = view["tokens"]
    choice = answer["choices"][1]
    assert len(tokens) == answer["usage"]["completion_tokens"] // 2 == 6
    ids = [t["id"] for t in tokens]
    assert view["text"] == tiny.tokenizer.decode(ids) == choice["text"]
    assert [t["label"] for t in tokens] == tiny.to_str_tokens(ids)
    n = tiny.config.n_layers
    assert view["layers"] == ["embed"] + [f"block {i}" for i in range(n)]
    for k, t in enumerate(tokens):
        assert t["position"] == len(PROMPT) + k
        dist = tiny.next_token_distribution(PROMPT + ids[:k])  # (V,), a separate forward pass
        p, top = torch.topk(dist, 3)
        assert [a["id"] for a in t["top"]] == top.tolist()
        assert [a["p"] for a in t["top"]] == pytest.approx(p.tolist(), abs=1e-6)
        assert t["p"] == pytest.approx(float(dist[t["id"]]), abs=1e-6)
        assert t["rank"] == int((dist > dist[t["id"]]).sum()) + 1
        assert t["p"] == pytest.approx(math.exp(choice["logprobs"]["token_logprobs"][k]), rel=1e-4)
        lens = tiny.logit_lens(PROMPT + ids[:k])  # (N + 1, V) at the last position
        assert [row["top"][0]["id"] for row in t["lens"]] == lens.argmax(-1).tolist()
        assert [row["p_token"] for row in t["lens"]] == pytest.approx(
            lens[:, t["id"]].tolist(), abs=1e-6
        )
        assert t["lens"][-1]["p_token"] == pytest.approx(t["p"], abs=1e-6)  # the last row


def test_layers_query_picks_lens_rows(url, tiny):
    cid = completion(url, max_tokens=2)["id"]
    view = inspect(url, cid, layers="-1,embed,0").json()
    n = tiny.config.n_layers
    assert view["layers"] == ["embed", "block 0", f"block {n - 1}"]
    assert [len(t["lens"]) for t in view["tokens"]] == [3, 3]
    for query, param in [({"layers": "7"}, "layers"), ({"layers": "²"}, "layers"),
                         ({"choice": 1}, "choice"), ({"top": 0}, "top"), ({"top": 21}, "top")]:
        r = inspect(url, cid, **query)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (query, r.text)


def test_streamed_chat_completion_is_kept(url, tiny):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "temperature": 0, "stream": True}  # fmt: skip
    ids, text = set(), ""
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                ids.add(chunk["id"])
                text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
    (cid,) = ids
    assert cid.startswith("chatcmpl-")
    view = inspect(url, cid).json()
    tokens = [t["id"] for t in view["tokens"]]
    prompt = tiny.chat_prompt([{"role": "user", "content": "hi"}])
    assert [t["id"] for t in view["prompt_tokens"]] == prompt
    greedy = tiny.generate(prompt, max_new_tokens=5, temperature=0)  # the same answer
    assert greedy.tokens == tokens and greedy.text == text
    shown = [t for t in tokens if t not in tiny.tokenizer.eos_ids]
    assert tiny.tokenizer.decode(shown) == text
    assert all(t["rank"] == 1 for t in view["tokens"])  # greedy: each the argmax


def test_unknown_id_and_the_store_bound(url):
    check_error(inspect(url, "cmpl-nope"), 404, "completion_not_found", "'cmpl-nope'")
    made = [completion(url, max_tokens=1)["id"] for _ in range(5)]  # keep=4: the first goes
    check_error(inspect(url, made[0]), 404, "completion_not_found", "keeps the last 4")
    assert all(inspect(url, c).status_code == 200 for c in made[1:])


def test_another_key_cannot_read_it(url):
    # this server has no --api-key: each client's own bearer token still owns its completions
    cid = completion(url, key="alice", max_tokens=1)["id"]
    assert inspect(url, cid, key="alice").status_code == 200
    check_error(inspect(url, cid, key="bob"), 404, "completion_not_found", "another key")
    check_error(inspect(url, cid), 404, "completion_not_found", "another key")


def test_server_key_refuses_other_keys(tiny):
    with serving(create_app(tiny, model_id=MODEL, api_key="k1", inspect=InspectStore())) as u:
        cid = completion(u, key="k1", max_tokens=1)["id"]
        assert inspect(u, cid, key="k1").status_code == 200
        check_error(inspect(u, cid, key="k2"), 401, "invalid_api_key", "API key")


def test_off_by_default(tiny):
    with serving(create_app(tiny, model_id=MODEL)) as u:
        cid = completion(u, max_tokens=1)["id"]
        check_error(inspect(u, cid), 404, "inspection_off", "clearlm serve --inspect")
        doc = httpx.get(u.removesuffix("/v1") + "/openapi.json", timeout=30).json()
    op = doc["paths"]["/v1/inspect/{completion_id}"]["get"]
    assert set(op["responses"]) == {"200", "400", "404", "409"}
    assert {p["name"] for p in op["parameters"]} == {"completion_id", "choice", "top", "layers"}


def test_store_evicts_by_use_and_age():
    now = [0.0]
    store = InspectStore(keep=2, ttl_s=10, clock=lambda: now[0])
    key = b"k"
    store.put("a", key, [[1, 2, 3]], [(0, [4, 5])])
    store.put("b", key, [[1]], [(0, [2]), (0, [3])])
    assert store.get("a", key) is not None  # a is now the most recently used
    store.put("c", key, [[1]], [(0, [])])
    assert store.get("b", key) is None and store.get("a", key) is not None
    assert store.get("a", b"other") is None
    rec = store.get("a", key)
    assert rec.tokens() == 5 and rec.nbytes() == 8 * 5 + 1024
    assert [g.itemsize for _, g in rec.choices] == [8]  # int64 ids: 8 bytes a token
    now[0] = 10.0  # a and c were made at 0: both expire at ttl_s
    assert len(store) == 0 and store.get("a", key) is None
    assert (INSPECT_KEEP, INSPECT_TTL_S) == (DEFAULT_KEEP, DEFAULT_TTL_S)  # the CLI's defaults


class Watched(InspectStore):
    """An InspectStore that logs begin and put, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def begin(self, completion_id: str, key: bytes) -> None:
        self.calls.append(("begin", completion_id))
        super().begin(completion_id, key)

    def put(self, completion_id: str, *args) -> None:
        self.calls.append(("put", completion_id))
        super().put(completion_id, *args)


def test_a_completion_still_generating_is_a_409_and_long_ids_are_cut(tiny):
    store = Watched()
    with serving(create_app(tiny, model_id=MODEL, inspect=store)) as u:
        cid = completion(u, max_tokens=1)["id"]
        assert store.calls == [("begin", cid), ("put", cid)]  # pending while it generated
        store.begin("cmpl-running", key_digest(b"alice"))  # as generate() does on start
        check_error(inspect(u, "cmpl-running", key="alice"), 409, "completion_in_progress",
                    "completion 'cmpl-running' is still being generated; ask again when")
        check_error(inspect(u, "cmpl-running", key="bob"), 404, "completion_not_found", "")
        long = "x" * 5000
        r = inspect(u, long)
        check_error(r, 404, "completion_not_found", f"no completion {'x' * 64!r}… is kept")
        assert len(r.json()["error"]["message"]) < 300


def test_pending_ids_end_when_kept_or_expired():
    now = [0.0]
    store = InspectStore(keep=2, ttl_s=10, clock=lambda: now[0])
    store.begin("a", b"k")
    store.begin("b", b"k")
    assert store.in_progress("a", b"k") and not store.in_progress("a", b"other")
    store.put("a", b"k", [[1]], [(0, [2])])
    assert not store.in_progress("a", b"k") and store.get("a", b"k") is not None
    now[0] = 10.0  # b never ended (a request that died): it goes at ttl_s
    assert not store.in_progress("b", b"k")
