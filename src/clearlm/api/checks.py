"""Type checks on the Python API's arguments, so a wrong type is a typed ClearLMError with a
message naming the argument, not a Python error from deep inside (or a silent wrong answer,
such as ``[True, False]`` read as token ids 1 and 0).

Also: a keyword setting from another library (``max_length``, ``do_sample``) ends as a typed
error that says what to write instead. Used by clearlm.api.model (prompts, sampling params, keyword
settings); the checks the generation loop needs itself (stop strings, callables) are in
clearlm.generation.stops.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from clearlm.errors import ChatTemplateError, PromptTypeError, SamplingParamsError
from clearlm.generation.stops import type_name
from clearlm.sampling.params import SamplingParams  # (no torch: the CLI checks before loading)


def is_token_id(value: Any) -> bool:
    """An int (Python, NumPy, or a 0-dim integer tensor), not a bool."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        dt = value.dtype
        return value.ndim == 0 and not (dt.is_floating_point or dt.is_complex or dt == torch.bool)
    if isinstance(value, bool) or type_name(value) == "bool_":  # NumPy's bool is Integral-free
        return False
    return isinstance(value, numbers.Integral)


def check_ids(prompt: Any) -> list[int]:
    """A prompt that is not text → its token ids as ints.

    Raises:
        PromptTypeError: not an ordered collection (a dict, a set, a number), or an item that
            is not an integer (a str: batches are not supported; a bool; a float).
    """
    if not isinstance(prompt, Iterable):
        raise PromptTypeError(f"a prompt is text or a list of token ids, not {prompt!r}")
    if isinstance(prompt, Mapping | set | frozenset):  # no order, or keys that are not ids
        raise PromptTypeError(f"a prompt is text or a list of token ids, not a {type_name(prompt)}")
    items = list(prompt)
    bad = [i for i, x in enumerate(items) if not is_token_id(x)]
    if bad:
        kinds = "/".join(sorted({type_name(items[i]) for i in bad}))
        hint = (
            "; generate() and stream() take a list of prompts, other methods one"
            if any(isinstance(items[i], str | bytes) for i in bad)
            else "; token ids are ints"
        )
        first = items[bad[0]]
        raise PromptTypeError(
            f"a prompt is text (str) or a list of token ids, got a {type_name(prompt)} "
            f"holding {kinds}: item {bad[0]} is {first!r} ({type_name(first)}){hint}"
        )
    return [int(i) for i in items]


def check_messages(messages: Any) -> None:
    """Raise PromptTypeError unless messages is a list of {'role': ..., 'content': ...}."""
    if isinstance(messages, Mapping):
        raise PromptTypeError(
            "a conversation is a list of messages: wrap the dict in a list, [{...}]"
        )
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
        raise PromptTypeError(
            "a conversation is text (str) or a list of {'role': ..., 'content': ...} dicts, "
            f"got {type_name(messages)}"
        )
    for m in messages:
        if not isinstance(m, Mapping):
            raise PromptTypeError(
                f"each message is a {{'role': ..., 'content': ...}} dict, got {type_name(m)} {m!r}"[
                    :200
                ]
            )


def check_params(params: Any) -> SamplingParams | None:
    """params= as given: a SamplingParams, None, or a dict of its fields (→ SamplingParams).
    Raises SamplingParamsError for another type or an unknown field."""
    if params is None or isinstance(params, SamplingParams):
        return params
    if isinstance(params, Mapping):
        try:
            return SamplingParams(**params)
        except TypeError as e:  # an unknown keyword
            raise SamplingParamsError(f"params: {e}".replace("__init__() ", "")) from None
    raise SamplingParamsError(
        f"params must be a SamplingParams or a dict of its fields, got {type_name(params)}"
    )


# Settings other libraries (transformers' generate, llama.cpp, OpenAI) use, and what to say.
HINTS = {
    "max_length": "use max_new_tokens (the count of generated tokens, prompt not included)",
    "max_tokens": "use max_new_tokens",
    "n_predict": "use max_new_tokens",
    "do_sample": "temperature=0 is greedy; any temperature > 0 samples",
    "num_beams": "beam search is not supported; temperature=0 is greedy",
    "stop_strings": "use stop=",
}


def check_sampling_keywords(sampling: dict[str, Any], method: str) -> None:
    """Raise for a keyword that is not a SamplingParams field.

    Args:
        sampling: the ``**sampling`` keywords a Model method received.
        method: the method's name, for the message ("generate").

    Raises:
        SamplingParamsError: one line naming the first unknown setting, a hint when another
            library's name was used, and the known settings.
    """
    known = [f.name for f in fields(SamplingParams)]
    unknown = [k for k in sampling if k not in known]
    if not unknown:
        return
    name = unknown[0]
    hint = f" ({HINTS[name]})" if name in HINTS else ""
    raise SamplingParamsError(
        f"{method}() got an unknown setting {name!r}{hint}; the settings are max_new_tokens, "
        f"stop, params, and {', '.join(known)}"
    )


def merge_params(
    params: Any, sampling: dict[str, Any], defaults: dict[str, Any], fallback: dict[str, Any] | None
) -> SamplingParams:
    """The settings a call runs with: ``params`` as given (a SamplingParams or a dict of its
    fields), or else the keywords in ``sampling`` over ``defaults`` (the model's
    generation_config.json) over ``fallback``; keywords set to None count as unset.

    Raises SamplingParamsError when both params and keywords are given, or a value is invalid."""
    given = {k: v for k, v in sampling.items() if v is not None}
    checked = check_params(params)  # a dict of fields becomes a SamplingParams
    if checked is not None:
        if given:
            raise SamplingParamsError(
                "pass sampling settings either as params= or as keywords, not both "
                f"(got params and {', '.join(sorted(given))})"
            )
        return checked
    return SamplingParams(**{**(fallback or {}), **defaults, **given})


def with_system(messages: Any, system: str | None) -> Any:
    """A conversation with ``system`` as its first message (a plain string is one user
    message); unchanged when ``system`` is None.

    Raises ChatTemplateError when the messages already start with a system message."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if system is None:
        return messages
    if messages and messages[0].get("role") == "system":
        raise ChatTemplateError("the messages start with a system message; drop system=")
    return [{"role": "system", "content": system}, *messages]
