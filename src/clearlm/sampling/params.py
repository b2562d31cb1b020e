"""The sampling settings and their one validation: :class:`SamplingParams` checks every field
once, when it is made, so the chain in :mod:`clearlm.sampling.chain` runs on trusted values and
checks nothing per token. :func:`validate` is the rule table's one entry point, also used by
the checked ``apply_*`` functions (for direct callers) and by ``defaults.py`` (a file's values).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from clearlm.errors import SamplingParamsError


def is_real(x: object) -> bool:
    """A real number that is not a bool (bool is an int: reject it)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_int(x: object) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


# setting -> (is the value valid?, the valid range as the error message states it)
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda t: is_real(t) and 0 <= t < math.inf, "in [0, inf) (0 means greedy)"),
    "temperature>0": (lambda t: is_real(t) and 0 < t < math.inf, "in (0, inf)"),
    "top_k": (lambda k: is_int(k) and k >= 0, "an integer >= 0 (0 means off)"),
    "top_p": (lambda p: is_real(p) and 0 < p <= 1, "in (0, 1] (1 means off)"),
    "min_p": (lambda m: is_real(m) and 0 <= m <= 1, "in [0, 1] (0 means off)"),
    "repetition_penalty": (lambda r: is_real(r) and 0 < r < math.inf, "in (0, inf) (1 means off)"),
    "presence_penalty": (lambda c: is_real(c) and -2 <= c <= 2, "in [-2, 2] (0 means off)"),
    "frequency_penalty": (lambda c: is_real(c) and -2 <= c <= 2, "in [-2, 2] (0 means off)"),
    "seed": (lambda s: s is None or (is_int(s) and 0 <= s < 2**64), "None or an int in [0, 2**64)"),
    "logit_bias": (
        lambda b: b is None or isinstance(b, Mapping),
        "None or a dict {token id: bias in [-100, 100]}",
    ),
    "ignore_eos": (lambda b: isinstance(b, bool), "True or False"),
}
MAX_BIAS = 100.0  # OpenAI's range for logit_bias values: [-100, 100]


def check_logit_bias(bias: Mapping[Any, Any] | None, vocab_size: int | None = None) -> None:
    """Raise a one-line SamplingParamsError naming the first bad entry of ``logit_bias``: a key
    that is not a token id (an int >= 0, below ``vocab_size`` when given) or a bias outside
    [-100, 100]. OpenAI's rule: "values between -100 and 100"."""
    for key, value in (bias or {}).items():
        if not is_int(key) or key < 0 or (vocab_size is not None and key >= vocab_size):
            valid = f"[0, {vocab_size})" if vocab_size is not None else "an int >= 0"
            raise SamplingParamsError(
                f"logit_bias key {key!r} is not a token id: give token ids in {valid}"
            )
        if not (is_real(value) and -MAX_BIAS <= value <= MAX_BIAS):
            raise SamplingParamsError(
                f"logit_bias[{key}] must be a number in [-100, 100], got {value!r}"
            )


def validate(name: str, value: object, rule: str | None = None) -> None:
    """Raise a one-line SamplingParamsError naming the setting, its value and the valid range.

    ``rule`` picks another row of :data:`RULES` than ``name`` (``"temperature>0"``)."""
    ok, valid = RULES[rule or name]
    if not ok(value):
        raise SamplingParamsError(f"{name} must be {valid}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token from the logits; defaults mean plain sampling from softmax.

    Attributes:
        temperature: divide logits by T before softmax; 0 means greedy (argmax). Range [0, inf).
        top_k: keep the k most likely tokens; 0 means off. Integer >= 0.
        top_p: nucleus sampling (Holtzman et al. 2019); 1.0 means off. Range (0, 1].
        min_p: drop tokens whose probability is below min_p * max probability; 0 means off.
        repetition_penalty: CTRL penalty (Keskar et al. 2019) on tokens already seen; 1.0 is off.
        presence_penalty: OpenAI's presence penalty: subtracted once from the logit of every
            token the sequence has generated so far (not the prompt's). Range [-2, 2]; 0 is off.
        frequency_penalty: OpenAI's frequency penalty: subtracted from a generated token's logit
            once per time it was generated. Range [-2, 2]; 0 is off.
        seed: seed of the sampler's torch.Generator, in [0, 2**64); None means a random seed.
        logit_bias: ``{token id: bias}`` added to the logits before every other step (OpenAI's
            ``logit_bias``: -100 bans a token in practice, +100 forces it); biases in
            [-100, 100]. None or empty means off. Ids must be in the vocabulary (checked when
            generation starts).
        ignore_eos: keep generating past the model's end tokens (they are sampled and shown
            like any token), so exactly ``max_new_tokens`` are produced unless a stop string or
            the context ends it first (llama-server's and vLLM's ``ignore_eos``).

    Raises:
        SamplingParamsError: a value is out of range (the message names it and the range).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: Mapping[int, float] | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            validate(f.name, getattr(self, f.name))
        check_logit_bias(self.logit_bias)
        if self.logit_bias is not None:  # a copy: the caller's dict may change later
            object.__setattr__(self, "logit_bias", dict(self.logit_bias))

    @property
    def is_greedy(self) -> bool:
        """True when temperature == 0: the sampler takes the argmax instead of drawing."""
        return self.temperature == 0
