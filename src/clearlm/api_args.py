"""Checks on the keyword settings of :class:`clearlm.api.Model`'s methods, so that a setting
from another library (``max_length``, ``do_sample``) ends as a typed error that says what to
write instead, not as ``TypeError: SamplingParams.__init__() got an unexpected keyword``."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from clearlm.errors import SamplingParamsError
from clearlm.sampling import SamplingParams

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
