"""A model whose chat template asks for 1 GB (or loops for ever) gets a 400 per chat request,
and the server keeps serving (it was killed by the first chat request)."""

from __future__ import annotations

import httpx
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.serve import create_app

HOSTILE = (
    "{% if messages[0]['content'] == 'loop' %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% else %}{{ 'x' * 1000000000 }}{% endif %}"
)


def test_hostile_template_is_a_400_and_the_server_lives(tmp_path) -> None:
    model = clearlm.load(write_tiny_llama(tmp_path / "t.gguf", chat_template=HOSTILE))
    with serving(create_app(model, model_id="tiny")) as url:
        for content, says in [
            ("hi", "stopped: it builds a repeated string or list of 1,000,000,000 characters"),
            ("loop", "stopped: its loops run over 1,000,000 iterations"),
        ]:
            body = {"model": "tiny", "messages": [{"role": "user", "content": content}]}
            r = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["message"].startswith("chat template of t.gguf stopped: ")
            assert says in error["message"] and error["param"] == "messages"
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        r = httpx.post(f"{url}/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
