"""The request bodies the server accepts, checked field by field before anything runs.

Bodies are parsed here rather than by FastAPI so that every failure (not UTF-8, not JSON, an
unknown field, a wrong type) is one :class:`~clearlm.serve.errors.APIError` naming the field.
Types are strict (``"temperature": "0.5"`` or ``"stream": 1`` are errors; a JSON integer fills
a float field) and unknown fields are refused, so a misspelt setting is never silently
ignored; ``null`` means "unset" for every optional field, as some clients send it. Value
ranges of the sampling settings are :class:`~clearlm.sampling.chain.SamplingParams`' own (see
:func:`clearlm.serve.requests.sampling_params`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from clearlm.serve.errors import APIError
from clearlm.text import clean_text

Text = Annotated[str, AfterValidator(clean_text)]  # a JSON "\ud800" escape becomes U+FFFD
MAX_LOGPROBS = 20  # OpenAI's limit for top_logprobs


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(Strict):
    include_usage: bool = False


class JsonSchemaFormat(Strict):
    """``response_format.json_schema``: OpenAI's named schema; ``schema`` is checked by the
    grammar engine (clearlm.sampling.grammar), not here."""

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # accepted: the output is always constrained to the schema


class ResponseFormat(Strict):
    """Structured output: ``{"type": "text" | "json_object" | "json_schema", ...}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class Sampling(Strict):
    """The fields both endpoints share. Unset (None) settings take the model's defaults."""

    model: str
    max_tokens: int | None = Field(default=None, ge=0)  # 0: generate nothing
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: Text | list[Text] | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1)  # None (null): 1
    stream: bool | None = None  # None (null): false
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted and ignored, as an end-user id for the caller's logs
    logit_bias: dict[str, float] | None = None  # token id (as JSON keys are text) -> bias
    ignore_eos: bool | None = None  # llama-server's and vLLM's: end tokens do not end a choice
    response_format: ResponseFormat | None = None  # structured output (serve/requests.py)


class CompletionBody(Sampling):
    """``POST /v1/completions``: a text prompt (or token ids) to continue, or a list of them."""

    prompt: Text | list[int] | list[Text] | list[list[int]]  # one prompt, or a list of them
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = None


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None  # None (or absent): an assistant's tool calls only
    name: str | None = None  # accepted; the chat templates clearlm runs do not read it
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls, sent back
    tool_call_id: str | None = None  # a "tool" message: the call it answers

    @model_validator(mode="before")
    @classmethod
    def _calls_need_no_content(cls, value: Any) -> Any:
        """OpenAI lets an assistant message with ``tool_calls`` leave ``content`` out."""
        if isinstance(value, dict) and value.get("tool_calls") and "content" not in value:
            return {**value, "content": None}
        parts = value.get("content") if isinstance(value, dict) else None
        for part in parts if isinstance(parts, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind != "text":  # image_url, input_audio, file, ...
                raise ValueError(f"a content part of type {kind!r}: the models clearlm runs "
                                 "take text only; send text parts ({\"type\": \"text\", ...})")
        return value

    @model_validator(mode="after")
    def _content_or_calls(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is null; only an assistant message with tool_calls may "
                             "leave it out")  # fmt: skip
        return self

    def text(self) -> str:
        """The content as one string: text parts joined with a newline, as llama-server and
        vLLM join them ("What is" + "the best book" must not read "What isthe best book")."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)


class Function(Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema, rendered as given
    strict: bool | None = None  # accepted; output is not constrained to the schema


class Tool(Strict):
    type: Literal["function"]
    function: Function


class ChatBody(Sampling):
    """``POST /v1/chat/completions``: a conversation rendered with the model's chat template."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # accepted: every call in the answer is returned


Body = TypeVar("Body", bound=Strict)


def _where(loc: tuple[Any, ...]) -> str:
    """pydantic's error location as a dotted field path: ``messages.0.content``. Union members
    (``str``, ``list[int]``) and validator names are left out."""
    keep = [str(x) for x in loc if isinstance(x, int) or not any(c in str(x) for c in "[]()")]
    return ".".join(k for k in keep if k not in ("str", "int", "function-after"))


def error_code(kind: str) -> str:
    """The ``code`` of a refused field, from pydantic's error type, in OpenAI's words:
    ``missing_required_parameter``, ``unknown_parameter``, ``invalid_type`` (a JSON value of
    the wrong type: ``string_type``, ``int_type``, ...) or ``invalid_value`` (a value out of its
    range or choices: ``greater_than_equal``, ``literal_error``, ``too_short``, ...)."""
    if kind == "missing":
        return "missing_required_parameter"
    if kind == "extra_forbidden":
        return "unknown_parameter"
    if kind.endswith("_type") or kind in ("int_from_float", "is_instance_of"):
        return "invalid_type"
    return "invalid_value"


# what json.loads gives → JSON's own name for it, as a client wrote it
_JSON_TYPES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
               str: "a string", list: "an array"}  # fmt: skip


def parse(raw: bytes, kind: type[Body]) -> Body:
    """Decode, parse and check a request body.

    Raises:
        APIError (400): not UTF-8, not JSON (or nested too deeply to parse), not a JSON
            object, or a field that is unknown, missing, of the wrong type or out of its range
            (the first problem: its field in ``param``, its kind in ``code``, see
            :func:`error_code`).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(
            400, f"the body is not valid UTF-8 (byte {e.start}); send JSON as UTF-8",
            code="invalid_utf8",
        ) from None  # fmt: skip
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise APIError(
            400, f"the body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})",
            code="invalid_json",
        ) from None  # fmt: skip
    except RecursionError:  # "[[[[...]]]]" deeper than Python's recursion limit
        raise APIError(
            400, "the body is nested too deeply to parse; send a flatter JSON object",
            code="invalid_json",
        ) from None  # fmt: skip
    if not isinstance(data, dict):
        got = _JSON_TYPES.get(type(data), type(data).__name__)
        raise APIError(400, f"the body must be a JSON object, got {got}", code="invalid_type")
    try:
        return kind.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = _where(first.get("loc", ()))
        msg = first.get("msg", "invalid").removeprefix("Value error, ")  # our validators' own
        if first.get("type") == "extra_forbidden":
            msg = (
                "unknown field; see docs/serving.md (Routes and request fields) for the "
                "supported ones"
            )
        # the other fields at fault, named (a missing "model" used to hide the real mistake)
        others = dict.fromkeys(_where(x.get("loc", ())) or "body" for x in e.errors()[1:])
        others.pop(where or "body", None)
        names = ", ".join(list(others)[:4]) + (", …" if len(others) > 4 else "")
        extra = f" (also invalid: {names})" if others else ""
        code = error_code(first.get("type", ""))
        raise APIError(400, f"{where or 'body'}: {msg}{extra}", where or None, code) from None
