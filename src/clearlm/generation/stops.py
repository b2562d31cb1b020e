"""Checks on what the generation loop is handed besides the prompt: stop strings and callbacks.

They live with the loop (not with the API's argument checks, clearlm.api.checks) because the
loop, the batch path and the CLI all call them; none imports torch, so the CLI can refuse a bad
``--stop`` before loading a model.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from clearlm.errors import ClearLMError, SamplingParamsError


def type_name(value: Any) -> str:
    """'str', 'dict', 'bytes', ... for messages."""
    return type(value).__name__


def check_stop(stop: Any) -> list[str]:
    """A stop string or a list of them → the list (a bare string is one stop, not its
    characters). Raises SamplingParamsError for a non-str or an empty string."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if isinstance(stop, bytes | bytearray) or not isinstance(stops, Iterable):
        raise SamplingParamsError(
            f"stop must be a string or a list of strings, got {type_name(stop)} {stop!r}"
        )
    stops = list(stops)
    for s in stops:
        if not isinstance(s, str):
            raise SamplingParamsError(
                f"stop must be a string or a list of strings, got a {type_name(s)} {s!r} in it"
            )
        if not s:
            raise SamplingParamsError("a stop string must not be empty (it would match at once)")
    return stops


def check_callable(fn: Any, what: str) -> None:
    """Raise ClearLMError unless fn is callable (None is allowed where a hook is optional)."""
    if not callable(fn):
        raise ClearLMError(f"{what} must be a function, got {type_name(fn)} {fn!r}"[:200])


def finish_reason(
    token: int | None,
    eos_ids: Collection[int],
    n_generated: int,
    max_new_tokens: int,
    n_filled: int,
    capacity: int,
    grammar_done: bool = False,
) -> str | None:
    """Why a sequence ends after its latest token, or None while it goes on: the one rule that
    single-sequence generation and both engines (continuous batching, serial) follow.

    In this order: "eos" (``token`` is one of the model's end ids), "stop" (``grammar_done``:
    structured output's grammar can take no further token), "length" (``n_generated``
    reached ``max_new_tokens``), "context_length" (prompt + generated tokens, ``n_filled``, fill
    the ``capacity`` of the context or of the sequence's KV-cache slot, so no further token can
    be fed). Stop strings are matched on text, by the caller (TextStream), and give "stop".
    """
    if token is not None and token in eos_ids:
        return "eos"
    if grammar_done:
        return "stop"
    if n_generated >= max_new_tokens:
        return "length"
    if n_filled >= capacity:
        return "context_length"
    return None
