"""Chat templates: jinja2 in a sandbox, set up as transformers sets it up.

Reference: transformers utils/chat_template_utils.py (_compile_jinja_template and
render_jinja_template) and tokenization_utils_base.py (apply_chat_template, get_chat_template).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext

from clearlm.errors import ChatTemplateError
from clearlm.tokenizer.chat_sandbox import (
    LimitedSandbox,
    TemplateLimitError,
    limits,
    render_limited,
)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it for
    training masks); here it renders its body unchanged so such templates compile."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes HTML characters; transformers' keeps text as is.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=8)
def compile_chat_template(template: str) -> jinja2.Template:
    """Settings of transformers' _compile_jinja_template: HF-style whitespace (trim_blocks,
    lstrip_blocks), loop controls, its tojson, raise_exception, strftime_now; in a sandbox whose
    renders are held to limits of size and loop iterations (:mod:`clearlm.tokenizer.chat_sandbox`).
    """
    env = LimitedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.compile_limited(template)


def pick_template(
    default: str | None, named: Mapping[str, str], tools: list[Any] | None, source: str
) -> str:
    """The template to render: 'tool_use' when tools are given and the model has one, else the
    default (transformers' get_chat_template).

    Raises:
        ChatTemplateError: the model has no chat template.
    """
    if tools is not None and "tool_use" in named:
        return named["tool_use"]
    if default is None:
        names = f" (only named ones: {', '.join(sorted(named))})" if named else ""
        raise ChatTemplateError(f"{source} has no chat template{names}")
    return default


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None,
    documents: list[dict[str, Any]] | None,
    variables: Mapping[str, Any],
    source: str,
) -> str:
    """Render one conversation as transformers' apply_chat_template(..., tokenize=False) does.

    Keys whose value is None are dropped from each message first (transformers does this since
    OpenAI-style messages carry ``content=None`` / ``tool_calls=None``).

    Raises:
        ChatTemplateError: the template failed to compile or render (including its own
            ``raise_exception('...')``, e.g. on roles that do not alternate), or it went past a
            limit of the sandbox (:mod:`clearlm.tokenizer.chat_sandbox`: size, loop iterations).
    """
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    inputs = json.dumps([messages, tools, documents], default=str, ensure_ascii=False)
    try:
        with limits(len(inputs)) as held:
            return render_limited(
                compile_chat_template(template),
                held.max_chars,
                **variables,
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
            )
    except TemplateLimitError as e:
        raise ChatTemplateError(f"chat template of {source} stopped: {e}") from None
    except Exception as e:  # jinja2.TemplateError, or TypeError etc. from odd messages
        msg = f"chat template of {source} failed ({type(e).__name__}: {e})"
        if isinstance(e, jinja2.UndefinedError) and any(
            "tool_calls" in m and "content" not in m for m in messages
        ):  # transformers fails alike: it drops content=None too, and the template needs one
            msg = (
                f"chat template of {source} cannot render an assistant message with tool_calls "
                f"and no content: this model's template does not render tool calls "
                f"({type(e).__name__}: {e})"
            )
        raise ChatTemplateError(msg) from None
