"""Structured output on the server through the official ``openai`` client, on the real default
model: ``response_format`` json_schema / json_object on both endpoints, streaming and not, and
several choices at once; every answer validates with jsonschema; a bad schema is a 400 naming
``response_format.json_schema.schema`` and the server goes on answering."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from serve_helpers import serving

from clearlm.engine.serial import SerialEngine
from clearlm.serve import create_app

ITEM = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "maxLength": 20},
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["item", "color", "count"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM, "strict": True}}
MSGS = [{"role": "user", "content": "Name one thing in a kitchen, as JSON."}]


@pytest.fixture(scope="module")
def client(smollm2):
    with serving(create_app(smollm2, model_id="m")) as url:
        yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def test_chat_json_schema_stream_equals_plain_and_choices_validate(client):
    ask = dict(model="m", messages=MSGS, max_tokens=60, temperature=0, response_format=FORMAT)
    plain = client.chat.completions.create(**ask).choices[0]
    assert plain.finish_reason == "stop"
    jsonschema.validate(json.loads(plain.message.content), ITEM)
    pieces = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(**ask, stream=True) if c.choices]  # fmt: skip
    assert "".join(pieces) == plain.message.content
    sampled = client.chat.completions.create(**{**ask, "temperature": 0.9}, n=2, seed=7)
    for choice in sampled.choices:  # each choice its own grammar state
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), ITEM)


def test_completions_json_object_and_text(client):
    prompt = "A JSON object describing a cat:"
    done = client.completions.create(model="m", prompt=prompt, max_tokens=60, temperature=0,
                                     extra_body={"response_format": {"type": "json_object"}})
    assert done.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(done.choices[0].text), dict)
    text = client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=0,
                                     extra_body={"response_format": {"type": "text"}})
    free = client.completions.create(model="m", prompt=prompt, max_tokens=5, temperature=0)
    assert text.choices[0].text == free.choices[0].text  # "text": no grammar at all


@pytest.mark.parametrize(("fmt", "param", "words"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}},
     "response_format.json_schema.schema", "Invalid type: foo"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
     "response_format.json_schema.schema", "nowhere"),
    ({"type": "json_schema"}, "response_format.json_schema", "json_schema"),
    ({"type": "yaml"}, "response_format.type", "json_schema"),
])  # fmt: skip
def test_bad_response_format_is_a_400_and_the_next_request_is_answered(client, fmt, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=5,
                                       response_format=fmt)  # fmt: skip
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == param and words in err["message"]
    ok = client.chat.completions.create(model="m", messages=MSGS, max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason == "length"


def test_serial_engine_follows_the_grammar(smollm2):
    with serving(create_app(smollm2, SerialEngine(smollm2.transformer, smollm2.tokenizer.eos_ids),
                            model_id="m")) as url:  # fmt: skip
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        r = c.chat.completions.create(model="m", messages=MSGS, max_tokens=60, temperature=0,
                                      response_format=FORMAT)  # fmt: skip
        jsonschema.validate(json.loads(r.choices[0].message.content), ITEM)
