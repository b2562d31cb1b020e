"""A request body's sampling settings as SamplingParams, one per choice.

- Unset sampling settings take the model's generation_config.json values, else clearlm's
  SamplingParams defaults (temperature 1, as OpenAI's); ranges are SamplingParams' own. A chat
  request answers as ``clearlm chat`` does (:func:`clearlm.sampling.defaults.chat_defaults`:
  the file's values, else ollama's temperature 0.8, top_k 40, top_p 0.9, repetition_penalty
  1.1, for every setting it leaves unset; temperature 0: plain greedy), so a chat choice
  equals ``model.chat`` with its settings.
- With a ``seed``, choice ``j`` of a prompt uses ``seed + j``, so it equals
  ``model.generate(..., seed=seed + j)``. A seed is in [0, 2**63) (a signed 64-bit int, as
  OpenAI's clients send it); -1 means random (llama.cpp's clients' convention).
- ``logit_bias`` keys are token ids written as JSON strings; biases in [-100, 100].
- ``repetition_penalty`` is in [1e-100, 1e100] (SamplingParams takes any value in (0, inf)):
  float32 logits (|z| <= 3.4e38) multiplied or divided by it stay far inside float64's range
  (1.8e308), so no request can overflow mid-generation, where the error would fail the whole
  batch with a 500 instead of refusing that one request (5e-324 did).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from clearlm.api.model import Model
from clearlm.errors import SamplingParamsError
from clearlm.sampling.chain import SamplingParams
from clearlm.sampling.defaults import chat_defaults
from clearlm.sampling.params import MAX_BIAS
from clearlm.serve.errors import APIError, from_clearlm
from clearlm.serve.schemas import ChatBody

SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty")  # fmt: skip
PENALTY_RANGE = (1e-100, 1e100)  # repetition_penalty the server runs (see above)
MAX_SEED = 2**63  # seeds are int64 for OpenAI's clients; with n <= max_n, seed + i stays < 2**64


def logit_bias(model: Model, bias: dict[str, float] | None) -> dict[int, float] | None:
    """``logit_bias`` with its keys (JSON object keys are strings) as token ids.

    Raises APIError (400, param ``logit_bias.KEY``): a key that is not a token id of the model,
    or a bias outside [-100, 100]."""
    out, vocab = {}, model.config.vocab_size
    for key, value in (bias or {}).items():
        where = f"logit_bias.{key}"
        if not (key.isascii() and key.isdigit() and int(key) < vocab):
            raise APIError(400, f"logit_bias key {key!r} is not a token id of this model; "
                           f"give ids in [0, {vocab})", where, "invalid_value")  # fmt: skip
        if not -MAX_BIAS <= value <= MAX_BIAS:
            raise APIError(400, f"logit_bias[{key}] must be in [-100, 100], got {value}", where,
                           "invalid_value")  # fmt: skip
        out[int(key)] = value
    return out or None


def sampling_params(model: Model, body: Any, n: int) -> list[SamplingParams]:
    """One SamplingParams per choice (seed + i). Raises APIError (400) naming the setting."""
    given = {k: getattr(body, k) for k in SETTINGS if getattr(body, k) is not None}
    given["logit_bias"] = logit_bias(model, body.logit_bias)
    given["ignore_eos"] = body.ignore_eos
    seed = body.seed
    if seed is not None and not (seed == -1 or 0 <= seed < MAX_SEED):
        raise APIError(400, f"seed must be -1 (random) or in [0, 2**63), got {seed}", "seed",
                       "invalid_value")  # fmt: skip
    seed = None if seed == -1 else seed  # llama.cpp's clients send -1 for "random"
    low, high = PENALTY_RANGE
    penalty = body.repetition_penalty
    if penalty is not None and not low <= penalty <= high:
        raise APIError(400, f"repetition_penalty must be in [1e-100, 1e100] (1 means off), got "
                       f"{penalty}", "repetition_penalty", "invalid_value")  # fmt: skip
    try:
        chat = isinstance(body, ChatBody)  # chat's defaults, as model.chat and clearlm chat
        fallback = chat_defaults(model.generation_defaults, given) if chat else {}
        base = model.sampling_params(None, fallback, **given)
    except SamplingParamsError as e:
        name = str(e).split(" ", 1)[0]
        known = {f.name for f in fields(SamplingParams)}
        raise from_clearlm(e, name if name in known else None) from None
    return [
        SamplingParams(**{**base.__dict__, "seed": None if seed is None else seed + i})
        for i in range(n)
    ]
