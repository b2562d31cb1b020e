"""Tools (function calling) on /v1/chat/completions, Hermes style, as Qwen2.5's template asks.

- ``tools`` are rendered by the model's own chat template (its ``tools`` variable, as
  transformers' ``apply_chat_template(tools=...)``); a template that never reads ``tools`` is
  refused (400, ``tools``) rather than silently leaving them out. ``tools: []`` and
  ``tool_choice: "none"`` render no tools at all. ``tool_choice: "required"`` or a named
  function constrains the answer with the grammar engine (clearlm.sampling.grammar) to one
  JSON object ``{"name": ..., "arguments": {...}}`` calling a declared tool (the named one),
  its arguments valid against the tool's ``parameters`` schema; it comes back as a call.
- The answer's calls are parsed from its text: each ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>`` (the format the template describes to the model); failing those, a whole
  answer that is one such JSON object (bare or in a ```json fence, as small models write it)
  naming a declared tool. Parsed calls become ``message.tool_calls`` (``arguments`` as JSON
  text, OpenAI's shape), the text outside them ``content`` (null when empty), and
  ``finish_reason`` "tool_calls". Text that does not parse stays content.
- Messages may send calls back: an assistant's ``tool_calls`` (their ``arguments`` JSON is
  given to the template as an object, as transformers' templates expect) and ``tool`` messages
  with the results.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from clearlm.serve.errors import APIError
from clearlm.serve.schemas import ChatBody, Message
from clearlm.tokenizer import Tokenizer

TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
FENCED = re.compile(r"\A```(?:json)?\s*(.*?)\s*```\Z", re.S)


def supports_tools(tokenizer: Tokenizer) -> bool:
    """Whether one of the model's chat templates reads the ``tools`` variable."""
    templates = [tokenizer.chat_template or "", *tokenizer.chat_templates.values()]
    return any(re.search(r"\btools\b", t) for t in templates)


def active_tools(body: ChatBody, tokenizer: Tokenizer) -> list[dict[str, Any]] | None:
    """The tools to render (None: none). Raises APIError (400) for tools the model's template
    cannot render."""
    choice = body.tool_choice
    if not body.tools or choice == "none":
        return None
    if not supports_tools(tokenizer):
        raise APIError(400, "this model's chat template does not render tools; send no tools "
                       "(or tool_choice: 'none')", "tools", "unsupported")  # fmt: skip
    return [t.model_dump(exclude_none=True) for t in body.tools]


def forced_call_schema(body: ChatBody) -> dict[str, Any] | None:
    """The JSON schema of the one call a ``tool_choice`` of ``"required"`` or
    ``{"type": "function", "function": {"name": ...}}`` forces (None: no call is forced): an
    object with the tool's ``name`` (a constant) and ``arguments`` valid against its
    ``parameters`` (any object when it has none); ``anyOf`` over the tools for "required".

    Raises APIError (400, ``tool_choice``): no tools to call, a name that is not among them, or
    a tool_choice of another shape."""
    choice = body.tool_choice
    if choice is None or choice in ("auto", "none"):
        return None
    tools = body.tools or []
    if isinstance(choice, str):  # "required" (the schema allows no other string)
        chosen = tools
    else:
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise APIError(400, 'tool_choice must be "none", "auto", "required" or {"type": '
                           '"function", "function": {"name": ...}}', "tool_choice",
                           "invalid_value")  # fmt: skip
        chosen = [t for t in tools if t.function.name == name]
        if tools and not chosen:
            raise APIError(400, f"tool_choice names {name!r}, which is not one of the tools",
                           "tool_choice", "invalid_value")  # fmt: skip
    if not chosen:
        raise APIError(400, "tool_choice forces a call, but the request has no tools; send "
                       "tools", "tool_choice", "invalid_value")  # fmt: skip
    calls = [
        {"type": "object",
         "properties": {"name": {"const": t.function.name},
                        "arguments": t.function.parameters or {"type": "object"}},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in chosen
    ]  # fmt: skip
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def arguments(text: str) -> Any:
    """A call's ``arguments`` JSON text as the object templates render (as given if not JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def template_message(m: Message) -> dict[str, Any]:
    """One message as the chat template reads it (a "developer" message is a system one)."""
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
    out["content"] = None if m.content is None and m.tool_calls else m.text()
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": arguments(c.function.arguments)}}
            for c in m.tool_calls
        ]  # fmt: skip
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _call(text: str, names: set[str] | None) -> dict[str, Any] | None:
    """A call from ``{"name": ..., "arguments": ...}`` text (None if it is not one; with
    ``names``, only a call of one of them)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    args = obj.get("arguments", {})
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": obj["name"],
            "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
        },
    }


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[Any]]:
    """(content, tool calls) of an answer: see the module's rules. ``content`` is None when
    calls were found and no other text is left."""
    calls, kept, last = [], [], 0
    for m in TAGGED.finditer(text):
        call = _call(m.group(1), None)
        if call is not None:
            calls.append(call)
            kept.append(text[last : m.start()])
            last = m.end()
    if calls:
        rest = ("".join(kept) + text[last:]).strip()
        return rest or None, calls
    bare = text.strip()
    fenced = FENCED.match(bare)
    names = {t["function"]["name"] for t in tools}
    call = _call(fenced.group(1) if fenced else bare, names)
    return (text, []) if call is None else (None, [call])
