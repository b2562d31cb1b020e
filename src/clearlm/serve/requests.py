"""From a checked body to the work to do: prompt ids, sampling settings per choice, limits.

Rules (documented in README.md, "Serving"):
- Unset sampling settings take the model's generation_config.json values, else clearlm's
  SamplingParams defaults (temperature 1, as OpenAI's); ranges are SamplingParams' own. A chat
  request that gives no sampling setting at all answers as ``clearlm chat`` does
  (:func:`clearlm.defaults.chat_defaults`: the file's values, else ollama's temperature 0.8,
  top_k 40, top_p 0.9, repetition_penalty 1.1), and so does one that sets some (the rest from
  there; temperature 0: plain greedy), so a chat choice equals ``model.chat`` with its settings.
- ``n`` choices are ``n`` independent sequences; with a ``seed``, choice ``i`` uses
  ``seed + i``, so choice ``i`` equals ``model.generate(..., seed=seed + i)``.
- ``max_tokens`` (chat: or ``max_completion_tokens``) defaults to 16 for completions (as
  OpenAI) and to what the context leaves for chat; above the context length it is refused
  (``invalid_value``). A request whose prompt plus the ``max_tokens`` it gives passes the
  context (the server's --max-seq-len, or the model's context length) is refused as OpenAI
  refuses it: 400, ``context_length_exceeded``, the numbers in the message. Without
  ``max_tokens``, a completion's default 16 stops at the context with finish_reason "length".
- Chat contents are text: special-token text typed in a message stays text (the injection
  rule of :meth:`clearlm.api.Model.chat_prompt`); a "developer" message is a system message.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from clearlm.api import Model
from clearlm.defaults import chat_defaults
from clearlm.errors import ClearLMError, SamplingParamsError
from clearlm.generation import check_fits
from clearlm.sampling import SamplingParams
from clearlm.serve.errors import APIError, from_clearlm
from clearlm.serve.schemas import ChatBody, CompletionBody

SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty")  # fmt: skip
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class Limits:
    """What one request may ask for: ``n`` choices at most (``max_n``), and prompt + completion
    tokens at most ``max_seq_len`` (the engine's positions per sequence; None: the model's
    context length)."""

    max_n: int = 8
    max_seq_len: int | None = None


def window(model: Model, limits: Limits) -> tuple[int, str]:
    """Tokens one request may hold (prompt + completion) and what sets that bound."""
    ctx = model.config.context_length
    if limits.max_seq_len is not None and limits.max_seq_len < ctx:
        return limits.max_seq_len, "the server's --max-seq-len"
    return ctx, "the model's context length"


@dataclass
class Job:
    """One HTTP request's work, ready for the engine."""

    prompt: list[int]
    params: list[SamplingParams]  # one per choice
    max_new_tokens: int
    stop: list[str]
    top_logprobs: int  # alternatives per token (0: none)
    logprobs: bool  # whether to return logprobs at all
    echo: str  # text to put before each choice's text ("" unless echo)
    stream: bool
    include_usage: bool


def sampling_params(model: Model, body: Any, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice (seed + i). Raises APIError (400) naming the setting."""
    given = {k: getattr(body, k) for k in SETTINGS if getattr(body, k) is not None}
    seed = body.seed
    if seed is not None and (seed < 0 or seed + n > 2**64):
        raise APIError(400, f"seed must be in [0, 2**64 - n), got {seed}", "seed", "invalid_value")
    chat = isinstance(body, ChatBody)  # chat's defaults, as model.chat and clearlm chat
    try:
        base = model.sampling_params(
            None, chat_defaults(model.generation_defaults, given) if chat else {}, **given
        )
    except SamplingParamsError as e:
        name = str(e).split(" ", 1)[0]
        known = {f.name for f in fields(SamplingParams)}
        raise from_clearlm(e, name if name in known else None) from None
    return [
        SamplingParams(**{**base.__dict__, "seed": None if seed is None else seed + i})
        for i in range(n)
    ]


def _common(model: Model, body: Any, prompt: list[int], max_tokens: int | None, limits: Limits,
            where: str, max_name: str = "max_tokens") -> dict[str, Any]:  # fmt: skip
    """The checks and fields both endpoints share. ``max_name``: the field that gave
    ``max_tokens`` (chat: ``max_completion_tokens`` when the client sent that), named in the
    errors."""
    (ctx, what), n = window(model, limits), body.n or 1
    if n > limits.max_n:
        raise APIError(400, f"n must be at most {limits.max_n}, got {n}", "n", "invalid_value")
    if body.logit_bias:
        raise APIError(400, "logit_bias is not supported", "logit_bias", "unsupported")
    if max_tokens is not None and max_tokens > ctx:
        raise APIError(
            400, f"{max_name} is {max_tokens} but {what} is {ctx}",
            max_name, "invalid_value",
        )  # fmt: skip
    if ctx < model.config.context_length and len(prompt) >= ctx:
        raise APIError(
            400, f"the prompt has {len(prompt)} tokens and {what} is {ctx}: no room for a new "
            "token; shorten the prompt (or start the server with a larger --max-seq-len)",
            where, "context_length_exceeded",
        )  # fmt: skip
    try:
        check_fits(len(prompt), ctx)
    except ClearLMError as e:  # an empty prompt is a bad value, not a long one
        raise from_clearlm(e, where, "invalid_value" if not prompt else None) from None
    if max_tokens is not None and len(prompt) + max_tokens > ctx:  # OpenAI's 400, not a cut
        inside = "the prompt" if where == "prompt" else "the messages"
        raise APIError(
            400, f"{what} is {ctx} tokens, but this request asks for "
            f"{len(prompt) + max_tokens} ({len(prompt)} in {inside}, {max_tokens} for the "
            f"completion, {max_name}); shorten the prompt or lower {max_name}",
            where, "context_length_exceeded",
        )  # fmt: skip
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not s for s in stop):
        raise APIError(400, "a stop string must not be empty", "stop", "invalid_value")
    return dict(
        prompt=prompt,
        params=sampling_params(model, body, n),
        stop=stop,
        stream=bool(body.stream),
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


def completion_job(model: Model, body: CompletionBody, limits: Limits) -> Job:
    """Raises APIError (400) for anything the model cannot run."""
    if body.echo and body.logprobs is not None:
        raise APIError(
            400, "echo with logprobs (prompt logprobs) is not supported", "echo", "unsupported"
        )
    try:
        prompt = model.encode(body.prompt)
    except ClearLMError as e:
        raise from_clearlm(e, "prompt") from None
    common = _common(model, body, prompt, body.max_tokens, limits, "prompt")
    max_new = body.max_tokens or COMPLETION_MAX_TOKENS
    echo = body.prompt if isinstance(body.prompt, str) else model.tokenizer.decode(prompt)
    return Job(
        **common,
        max_new_tokens=min(max_new, window(model, limits)[0] - len(prompt)),
        top_logprobs=body.logprobs or 0,
        logprobs=body.logprobs is not None,
        echo=echo if body.echo else "",
    )


def chat_job(model: Model, body: ChatBody, limits: Limits) -> Job:
    """Raises APIError (400) for anything the model cannot run (its template failing too)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        for m in body.messages
    ]
    try:
        prompt = model.chat_prompt(messages)  # contents are text: no control tokens from users
    except ClearLMError as e:
        raise from_clearlm(e, "messages") from None
    max_tokens = body.max_completion_tokens or body.max_tokens
    name = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    common = _common(model, body, prompt, max_tokens, limits, "messages", name)
    room = window(model, limits)[0] - len(prompt)
    return Job(
        **common,
        max_new_tokens=min(max_tokens or room, room),
        top_logprobs=body.top_logprobs or 0,
        logprobs=bool(body.logprobs),
        echo="",
    )
