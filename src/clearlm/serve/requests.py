"""From a checked body to the work to do: prompt ids, sampling settings per choice, limits.

Rules (documented in README.md, "Serving"; the sampling settings: :mod:`clearlm.serve.settings`):
- A completion request may give a list of prompts (texts, or lists of token ids): choice
  ``i * n + j`` is the ``j``-th of the ``n`` choices of prompt ``i``, as OpenAI lays them out.
- ``max_tokens`` (chat: or ``max_completion_tokens``) defaults to 16 for completions (as
  OpenAI) and to what the context leaves for chat; above the context length it is refused
  (``invalid_value``). 0 generates nothing (finish_reason "length"), as ``max_new_tokens=0``
  does in the Python API and the CLI; with ``echo`` and ``logprobs`` it scores the prompt
  alone. A request whose prompt plus the ``max_tokens`` it gives passes the context (the
  server's --max-seq-len, or the model's context length) is refused as OpenAI refuses it: 400,
  ``context_length_exceeded``, the numbers in the message. Without ``max_tokens``, a
  completion's default 16 stops at the context with finish_reason "length".
- Chat contents are text: special-token text typed in a message stays text (the injection
  rule of :meth:`clearlm.api.model.Model.chat_prompt`); a "developer" message is a system message.
  Tools: :mod:`clearlm.serve.tools`.
- ``response_format`` (both endpoints): ``text``, ``json_object`` or ``json_schema``; each
  choice gets its own grammar state (:func:`clearlm.generation.grammar.grammar_state`), so
  every choice's text is JSON valid against the schema, ending ("stop") when the JSON closes.
  A schema the grammar engine cannot use is a 400 naming ``response_format.json_schema.schema``
  and the engine's reason. One it gives up on only while generating (a choice's grammar
  cannot be followed: :class:`~clearlm.errors.GrammarError`) fails that request alone: a 400
  naming ``response_format`` (or, in a stream, an error event), the other requests go on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from clearlm.api.model import Model
from clearlm.errors import ClearLMError, SamplingParamsError
from clearlm.generation.grammar import grammar_state
from clearlm.generation.loop import check_fits
from clearlm.sampling.chain import SamplingParams
from clearlm.sampling.grammar import GrammarState, compile_response_format, json_schema_grammar
from clearlm.serve.errors import APIError, from_clearlm
from clearlm.serve.schemas import ChatBody, CompletionBody
from clearlm.serve.settings import sampling_params
from clearlm.serve.tools import active_tools, forced_call_schema, template_message

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class Limits:
    """What one request may ask for: ``n`` choices per prompt at most (``max_n``), ``max_prompts``
    prompts, and prompt + completion tokens at most ``max_seq_len`` (the engine's positions per
    sequence; None: the model's context length)."""

    max_n: int = 8
    max_seq_len: int | None = None
    max_prompts: int = 64


def window(model: Model, limits: Limits) -> tuple[int, str]:
    """Tokens one request may hold (prompt + completion) and what sets that bound."""
    ctx = model.config.context_length
    if limits.max_seq_len is not None and limits.max_seq_len < ctx:
        return limits.max_seq_len, "the server's --max-seq-len"
    return ctx, "the model's context length"


@dataclass
class Job:
    """One HTTP request's work, ready for the engine. Choice ``i * n + j`` runs prompt ``i``
    with ``params[j]``."""

    prompts: list[list[int]]  # one per prompt (chat: one)
    params: list[SamplingParams]  # one per choice of a prompt (n)
    max_new_tokens: list[int]  # per prompt; 0: nothing is generated
    stop: list[str]
    top_logprobs: int  # alternatives per token (0: none)
    logprobs: bool  # whether to return logprobs at all
    echo: list[str]  # per prompt: text to put before each choice's text ("" unless echo)
    stream: bool
    include_usage: bool
    score_prompts: bool = False  # echo + logprobs: the prompts' own logprobs are returned
    scored: list[Any] = field(default_factory=list)  # per prompt, filled by the app
    tools: list[dict[str, Any]] | None = None  # chat: the tools rendered (serve/tools.py)
    new_grammar: Callable[[], GrammarState | None] = lambda: None  # a fresh state per choice
    grammar_param: str = "response_format"  # the field a grammar that fails mid-run names


def response_grammar(model: Model, body: Any) -> Callable[[], GrammarState | None]:
    """What makes each choice's grammar state for the body's ``response_format``, or for the
    call a chat's ``tool_choice`` forces (no grammar: a function returning None). Raises
    APIError (400) naming the field at fault (``response_format.json_schema.schema`` for a
    schema the engine cannot use; ``tools`` for a forced tool's ``parameters``)."""
    fmt, forced = body.response_format, None
    if isinstance(body, ChatBody):
        forced = forced_call_schema(body)
    if forced is not None and fmt is not None and fmt.type != "text":
        raise APIError(400, "give response_format or a tool_choice that forces a call, not both",
                       "response_format", "invalid_value")  # fmt: skip
    if fmt is None and forced is None:
        return lambda: None
    try:
        if forced is not None:
            grammar = json_schema_grammar(forced, "tools (a forced call's parameters)")
        else:
            grammar = compile_response_format(fmt.model_dump(by_alias=True, exclude_none=True))
        make = partial(grammar_state, model.tokenizer, model.config.vocab_size, grammar)
        make()  # builds the vocabulary once (here, off the event loop) and checks the grammar
    except SamplingParamsError as e:  # the message starts with the field's name
        first = str(e).split(" ", 1)[0]
        named = first.startswith(("response_format", "tools"))
        param = first if named else "tools" if forced else "response_format"
        raise from_clearlm(e, param) from None
    return make


def grammar_param(body: Any) -> str:
    """The field whose grammar constrains the body's choices: ``tools`` for a chat whose
    ``tool_choice`` forces a call, else ``response_format``."""
    forced = isinstance(body, ChatBody) and forced_call_schema(body) is not None
    return "tools" if forced else "response_format"


def check_prompt(model: Model, prompt: list[int], max_tokens: int | None, limits: Limits,
                 where: str, max_name: str = "max_tokens") -> None:  # fmt: skip
    """Refuse (APIError 400) a prompt that is empty or leaves no room for ``max_tokens`` (room for
    one token unless max_tokens is 0). ``max_name``: the field that gave ``max_tokens`` (chat:
    ``max_completion_tokens`` when the client sent that), named in the errors."""
    ctx, what = window(model, limits)
    new = 0 if max_tokens == 0 else 1
    if ctx < model.config.context_length and len(prompt) + new > ctx:
        raise APIError(
            400, f"the prompt has {len(prompt)} tokens and {what} is {ctx}: no room for a new "
            "token; shorten the prompt (or start the server with a larger --max-seq-len)",
            where, "context_length_exceeded",
        )  # fmt: skip
    try:
        check_fits(len(prompt), ctx, new)
    except ClearLMError as e:  # an empty prompt is a bad value, not a long one
        raise from_clearlm(e, where, "invalid_value" if not prompt else None) from None
    if max_tokens is not None and len(prompt) + max_tokens > ctx:  # OpenAI's 400, not a cut
        inside = "the messages" if where == "messages" else "the prompt"
        raise APIError(
            400, f"{what} is {ctx} tokens, but this request asks for "
            f"{len(prompt) + max_tokens} ({len(prompt)} in {inside}, {max_tokens} for the "
            f"completion, {max_name}); shorten the prompt or lower {max_name}",
            where, "context_length_exceeded",
        )  # fmt: skip


def _common(model: Model, body: Any, max_tokens: int | None, limits: Limits,
            max_name: str = "max_tokens") -> dict[str, Any]:  # fmt: skip
    """The checks and fields both endpoints share (the prompts' own: :func:`check_prompt`)."""
    (ctx, what), n = window(model, limits), body.n or 1
    if n > limits.max_n:
        raise APIError(400, f"n must be at most {limits.max_n}, got {n}", "n", "invalid_value")
    if max_tokens is not None and max_tokens > ctx:
        raise APIError(
            400, f"{max_name} is {max_tokens} but {what} is {ctx}",
            max_name, "invalid_value",
        )  # fmt: skip
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream: true", "stream_options",
                       "invalid_value")  # fmt: skip
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not s for s in stop):
        raise APIError(400, "a stop string must not be empty", "stop", "invalid_value")
    return dict(
        params=sampling_params(model, body, n),
        new_grammar=response_grammar(model, body),
        grammar_param=grammar_param(body),
        stop=stop,
        stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


def prompt_list(body: CompletionBody, limits: Limits) -> list[tuple[str, Any]]:
    """(param name, prompt) for each prompt: ``prompt`` for one, ``prompt.i`` in a list."""
    p = body.prompt
    if isinstance(p, list) and p and isinstance(p[0], str | list):
        if len(p) > limits.max_prompts:
            raise APIError(400, f"a request takes at most {limits.max_prompts} prompts, got "
                           f"{len(p)}", "prompt", "invalid_value")  # fmt: skip
        return [(f"prompt.{i}", x) for i, x in enumerate(p)]
    return [("prompt", p)]


def completion_job(model: Model, body: CompletionBody, limits: Limits) -> Job:
    """Raises APIError (400) for anything the model cannot run."""
    common = _common(model, body, body.max_tokens, limits)
    prompts, echo, max_new = [], [], []
    for where, given in prompt_list(body, limits):
        try:
            ids = model.encode(given)
        except ClearLMError as e:
            raise from_clearlm(e, where) from None
        check_prompt(model, ids, body.max_tokens, limits, where)
        prompts.append(ids)
        text = given if isinstance(given, str) else model.tokenizer.decode(ids)
        echo.append(text if body.echo else "")
        room = window(model, limits)[0] - len(ids)
        wanted = COMPLETION_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        max_new.append(min(wanted, room))
    return Job(
        **common,
        prompts=prompts,
        max_new_tokens=max_new,
        top_logprobs=body.logprobs or 0,
        logprobs=body.logprobs is not None,
        echo=echo,
        score_prompts=bool(body.echo) and body.logprobs is not None,
    )


def chat_job(model: Model, body: ChatBody, limits: Limits) -> Job:
    """Raises APIError (400) for anything the model cannot run (its template failing too)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
    tools = active_tools(body, model.tokenizer)
    messages = [template_message(m) for m in body.messages]
    try:  # contents are text: no control tokens from users (Model.chat_prompt's rule)
        if tools is None:
            prompt = model.chat_prompt(messages)
        else:
            prompt = model.tokenizer.encode_chat(messages, tools=tools)
    except ClearLMError as e:
        raise from_clearlm(e, "messages") from None
    given = body.max_completion_tokens
    if given is not None and body.max_tokens is not None and given != body.max_tokens:
        raise APIError(400, f"max_tokens ({body.max_tokens}) and max_completion_tokens ({given}) "
                       "differ; send one (max_completion_tokens is OpenAI's current name)",
                       "max_completion_tokens", "invalid_value")  # fmt: skip
    max_tokens = body.max_tokens if given is None else given
    name = "max_tokens" if given is None else "max_completion_tokens"
    common = _common(model, body, max_tokens, limits, name)
    check_prompt(model, prompt, max_tokens, limits, "messages", name)
    room = window(model, limits)[0] - len(prompt)
    return Job(
        **common,
        prompts=[prompt],
        max_new_tokens=[room if max_tokens is None else min(max_tokens, room)],
        top_logprobs=body.top_logprobs or 0,
        logprobs=bool(body.logprobs),
        echo=[""],
        tools=tools,
    )
