"""LangChain's ``ChatOpenAI`` (langchain-openai) against ``clearlm serve`` on
qwen2.5-coder-0.5b-instruct, whose chat template renders tools: ``bind_tools`` with a Python
function, the model's call comes back parsed (name and arguments) as an ``AIMessage``'s
``tool_calls``, the function runs, and its ``ToolMessage`` sent back gets an answer that uses
it (asked with ``tool_choice: "none"`` and a system message saying to answer from a tool
result: without them the 0.5B model repeats its call). Greedy (temperature 0), so the run is
the same every time."""

from __future__ import annotations

import pytest
from serve_helpers import serving

import clearlm
from clearlm.errors import ModelNotFoundError
from clearlm.serve import create_app
from clearlm.store.catalog import resolve_model

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

MODEL = "qwen2.5-coder-0.5b-instruct"
SYSTEM = ("You are a helpful assistant. When a tool result is given, answer the user's question "
          "in one plain sentence using it.")  # fmt: skip


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return {"Paris": "sunny, 21 degrees Celsius"}.get(city, "unknown")


@pytest.fixture(scope="module")
def chat():
    try:
        path = resolve_model(MODEL)
    except ModelNotFoundError as e:
        pytest.skip(f"{MODEL} not available ({e})")
    with serving(create_app(clearlm.load(path), model_id=MODEL)) as url:
        yield langchain_openai.ChatOpenAI(base_url=url, api_key="none", model=MODEL,
                                          temperature=0, max_tokens=60, max_retries=0,
                                          timeout=300)  # fmt: skip


def test_bind_tools_call_and_answer(chat):
    llm = chat.bind_tools([get_weather])
    messages = [SystemMessage(SYSTEM), HumanMessage("What is the weather in Paris?")]
    ai = llm.invoke(messages)
    assert ai.response_metadata["finish_reason"] == "tool_calls"
    (call,) = ai.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    assert call["id"].startswith("call_") and call["type"] == "tool_call"
    result = get_weather.invoke(call["args"])
    messages += [ai, ToolMessage(result, tool_call_id=call["id"])]
    # the answer from the result: tool_choice "none" for the last turn, else the 0.5B model
    # writes the same call again (measured: three bare JSON calls until max_tokens)
    answer = chat.bind_tools([get_weather], tool_choice="none").invoke(messages)
    assert not answer.tool_calls and answer.response_metadata["finish_reason"] == "stop"
    assert "21" in answer.content or "sunny" in answer.content.lower(), answer.content


def test_with_structured_output_validates_against_its_schema(chat):
    """``with_structured_output`` (method "json_schema": OpenAI's response_format, strict), the
    other way LangChain asks a server for structured answers: the server's grammar constrains
    the answer, and LangChain parses it into the pydantic class (which validates it)."""
    from pydantic import BaseModel, Field

    class City(BaseModel):
        """A city and the country it is in."""

        name: str = Field(max_length=20)
        country: str = Field(max_length=20)

    got = chat.with_structured_output(City, method="json_schema").invoke(
        "Name the capital of France and its country."
    )
    assert isinstance(got, City) and got.name and got.country, got
