"""Where a call's sampling settings come from: the caller, the model's generation_config.json,
or clearlm's own defaults (in that order of precedence).

A Hugging Face folder's ``generation_config.json`` means what transformers' ``GenerationConfig``
makes of it. In transformers 5, ``GenerationMixin._prepare_generation_config`` fills every value
the file leaves unset from ``GenerationConfig._get_default_generation_params()``, and
``_get_logits_processor`` adds the sampling warpers only when ``do_sample`` is True:

- ``do_sample: true``: sample with the file's temperature, top_k, top_p and min_p; a value it
  leaves out is transformers' default: temperature 1.0, top_k 50 (not off!), top_p 1.0, min_p
  off. Gemma 3's ``{"do_sample": true, "top_k": 64, "top_p": 0.95}`` samples at T = 1.0.
- ``do_sample`` false or absent: greedy (clearlm's temperature 0), whatever temperature or top_p
  the file also sets; transformers warns and ignores them. top_k, top_p and min_p still resolve
  as above, so that a caller's temperature > 0 (clearlm's way of asking for sampling) samples as
  ``generate(do_sample=True, temperature=T)`` would on that model.
- ``repetition_penalty`` applies in both modes (a processor, not a warper); default 1.0.

A file that sets none of these keys (many hold only token ids, as ``save_pretrained`` writes
them) states no sampling choice, and clearlm's defaults apply as for a GGUF file:
:data:`GENERATE_DEFAULTS` for ``generate``/``stream``, :data:`CHAT_DEFAULTS` for ``chat``.
Settings transformers would apply but clearlm does not implement (``typical_p``, beams, ...) are
reported in :attr:`FileDefaults.ignored`; ``clearlm info`` lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from clearlm.sampling.params import SamplingParams

# When neither the caller nor a generation_config.json sets a value: free text is sampled at
# temperature 0.8; chat answers sample with ollama's defaults (its Modelfile documentation:
# temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1). Greedy chat made small models
# repeat one sentence until max_new_tokens (SmolLM2-135M-Instruct on short questions).
GENERATE_DEFAULTS: dict[str, Any] = {"temperature": 0.8}
CHAT_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "top_k": 40,
    "top_p": 0.9,
    "repetition_penalty": 1.1,
}

FILE = "generation_config.json"
USER, CLEARLM, TRANSFORMERS = "user", "clearlm default", "transformers default"
# transformers' GenerationConfig._get_default_generation_params() for the settings clearlm has
# (min_p: None there, i.e. no MinPLogitsWarper, which is clearlm's 0)
HF_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}
# transformers settings clearlm does not implement -> (the value meaning "off", sampling only?)
UNSUPPORTED: dict[str, tuple[Any, bool]] = {
    "typical_p": (1.0, True),
    "epsilon_cutoff": (0.0, True),
    "eta_cutoff": (0.0, True),
    "top_h": (None, True),
    "num_beams": (1, False),
    "no_repeat_ngram_size": (0, False),
}


@dataclass(frozen=True)
class FileDefaults:
    """What a folder's generation_config.json says about sampling, as transformers reads it.

    Attributes:
        values: SamplingParams field -> value for temperature, top_k, top_p, min_p and
            repetition_penalty (all five), or {} when there is no file or it sets no sampling
            key. Greedy files hold temperature 0.
        sources: the same keys -> "generation_config.json" (the file sets it, or its do_sample
            decides temperature) or "transformers default" (a gap transformers fills).
        ignored: "key=value" for settings transformers would apply and clearlm does not.
        path: the file read, or None.
    """

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    path: str | None = None


PER_CALL = ("logit_bias", "ignore_eos")  # settings of one call, never a model's default


def chat_defaults(
    file_values: dict[str, Any], given: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The sampling settings a chat answer takes for those its caller leaves unset.

    Args:
        file_values: the model's generation_config.json values (``Model.generation_defaults``:
            all five settings when the file sets any, as :func:`read_generation_config` fills
            them; {} for a GGUF file).
        given: the caller's settings (None: unset), which go over the result.

    Returns:
        The file's values when it sets any; else, when the caller asks for ``temperature`` 0,
        ``{"temperature": 0.0}`` (greedy is the model's own argmax, as before: no default
        repetition penalty, though one given still applies); else :data:`CHAT_DEFAULTS`.

    ``Model.chat``, the CLI's ``chat``/``run`` (one answer or a conversation) and the server's
    chat endpoint all take their defaults from here.
    """
    if file_values:
        return dict(file_values)
    if given and given.get("temperature") == 0:
        return {"temperature": 0.0}
    return dict(CHAT_DEFAULTS)


def resolve(
    fallback: dict[str, Any], file: FileDefaults, given: dict[str, Any]
) -> dict[str, tuple[Any, str]]:
    """Every SamplingParams setting but :data:`PER_CALL`'s -> (value, where it came from): the
    caller's ``given`` (None means unset) over the file's values over ``fallback``
    (GENERATE_DEFAULTS or CHAT_DEFAULTS) over SamplingParams' own defaults ("clearlm
    default")."""
    out: dict[str, tuple[Any, str]] = {}
    for f in fields(SamplingParams):
        name = f.name
        if name in PER_CALL:
            continue
        if given.get(name) is not None:
            out[name] = (given[name], USER)
        elif name in file.values:
            out[name] = (file.values[name], file.sources[name])
        else:
            out[name] = (fallback.get(name, f.default), CLEARLM)
    return out


def describe(file: FileDefaults) -> list[tuple[str, str, str, str]]:
    """Rows (setting, generate value, chat value, source) for ``clearlm info``; the seed is
    left out (random unless given)."""
    gen, chat = resolve(GENERATE_DEFAULTS, file, {}), resolve(CHAT_DEFAULTS, file, {})
    rows = []
    for name, (value, source) in gen.items():
        if name == "seed":
            continue
        chat_value, chat_source = chat[name]
        if chat_source != source:  # cannot happen today: both read the same file
            source = f"generate: {source}; chat: {chat_source}"
        rows.append((name, f"{value:g}", f"{chat_value:g}", source))
    return rows
