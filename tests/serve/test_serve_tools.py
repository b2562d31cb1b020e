"""Tools on /v1/chat/completions through the official ``openai`` client: empty ``tools`` and
``tool_choice: "none"`` everywhere; with Qwen2.5's template, tools rendered as transformers
renders them, the answer's call parsed into ``tool_calls``, and ``tool`` messages sent back."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine.serial import SerialEngine
from clearlm.errors import ModelNotFoundError
from clearlm.serve import create_app
from clearlm.serve.tools import parse_tool_calls
from clearlm.store.catalog import resolve_model

MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls"), [
    ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', None, [("f", {"x": 1})]),
    ('Sure.\n<tool_call>{"name": "f", "arguments": {}}</tool_call>\n<tool_call>{"name": "g", '
     '"arguments": {"y": "é"}}</tool_call>', "Sure.", [("f", {}), ("g", {"y": "é"})]),
    ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None,
     [("get_weather", {"city": "Paris"})]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', None,
     [("get_weather", {"city": "Oslo"})]),
    ('{"name": "undeclared", "arguments": {}}', '{"name": "undeclared", "arguments": {}}', []),
    ("Paris is sunny.", "Paris is sunny.", []),
])  # fmt: skip
def test_calls_are_parsed_from_the_text(text, content, calls):
    got_content, got = parse_tool_calls(text, [WEATHER])
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:  # ChatML without tools
    return clearlm.load(write_tiny_llama(tmp_path_factory.mktemp("t") / "t.gguf",
                                         context_length=256))  # fmt: skip


def test_empty_tools_and_tool_choice_none_are_accepted(tiny):
    with serving(create_app(tiny, model_id="tiny")) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        ask = dict(model="tiny", messages=MSGS, max_tokens=6, temperature=0)
        plain = c.chat.completions.create(**ask).choices[0].message.content
        extras = [dict(tools=[]), dict(tool_choice="none"),
                  dict(tools=[WEATHER], tool_choice="none"), dict(tools=[], tool_choice="auto")]
        for extra in extras:
            r = c.chat.completions.create(**ask, **extra)
            assert r.choices[0].message.content == plain and r.choices[0].message.tool_calls is None
        with pytest.raises(openai.BadRequestError, match="does not render tools") as e:
            c.chat.completions.create(**ask, tools=[WEATHER])
        assert e.value.body["param"] == "tools"
        with pytest.raises(openai.BadRequestError, match="does not render tools"):
            c.chat.completions.create(**ask, tools=[WEATHER], tool_choice="required")
        assert c.chat.completions.create(**ask).choices[0].message.content == plain


@pytest.fixture(scope="module")
def qwen() -> clearlm.Model:
    try:
        path = resolve_model("qwen2.5-coder-0.5b-instruct")
    except ModelNotFoundError as e:
        pytest.skip(f"qwen2.5-coder-0.5b-instruct not available ({e})")
    return clearlm.load(path)


def test_qwen_renders_tools_and_its_call_comes_back_as_tool_calls(qwen):
    engine = SerialEngine(qwen.transformer, qwen.tokenizer.eos_ids)
    with serving(create_app(qwen, engine, model_id="q")) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        ask = dict(model="q", messages=MSGS, tools=[WEATHER], max_tokens=40, temperature=0)
        r = c.chat.completions.create(**ask)
        assert r.usage.prompt_tokens == len(qwen.tokenizer.encode_chat(MSGS, tools=[WEATHER]))
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        chunks = list(c.chat.completions.create(**ask, stream=True))
        (streamed,) = [t for ch in chunks for t in (ch.choices[0].delta.tool_calls or [])]
        assert (streamed.index, streamed.function.name) == (0, "get_weather")
        assert json.loads(streamed.function.arguments) == {"city": "Paris"}
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        back = [*MSGS, r.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}]
        r2 = c.chat.completions.create(model="q", messages=back, tools=[WEATHER], max_tokens=3,
                                       temperature=0)  # fmt: skip
        templated = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}]  # fmt: skip
        want = qwen.tokenizer.encode_chat(templated, tools=[WEATHER])
        assert r2.usage.prompt_tokens == len(want)
        assert "<tool_response>\n{\"celsius\": 21}\n</tool_response>" in qwen.tokenizer.decode(want)


TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}  # fmt: skip


def test_qwen_tool_choice_forces_a_valid_call(qwen):
    """tool_choice "required" and a named function: the grammar engine constrains the answer
    to one call of a declared tool (the named one), its arguments valid against the tool's
    parameters, even for a question no tool answers (unforced, the model writes a haiku)."""
    with serving(create_app(qwen, model_id="q")) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        chat = [{"role": "user", "content": "Write a haiku about the sea."}]
        ask = dict(model="q", messages=chat, tools=[WEATHER, TIME], max_tokens=40, temperature=0)
        for choice, names in (("required", {"get_weather", "get_time"}),
                              ({"type": "function", "function": {"name": "get_time"}},
                               {"get_time"})):  # fmt: skip
            r = c.chat.completions.create(**ask, tool_choice=choice).choices[0]
            (call,) = r.message.tool_calls
            params = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
            assert call.function.name in names and r.finish_reason == "tool_calls"
            jsonschema.validate(json.loads(call.function.arguments), params[call.function.name])
        with pytest.raises(openai.BadRequestError, match="not one of the tools") as e:
            c.chat.completions.create(**ask, tool_choice={"type": "function",
                                                          "function": {"name": "nope"}})
        assert e.value.body["param"] == "tool_choice"
        bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}
        with pytest.raises(openai.BadRequestError, match="Invalid type: foo") as e:
            c.chat.completions.create(**{**ask, "tools": [bad]}, tool_choice="required")
        assert e.value.body["param"] == "tools"
