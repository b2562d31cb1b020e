"""Sampling: logits → probabilities → the next token (the seed's last stage, §softmax and
§sampling).

``params.py`` declares :class:`SamplingParams` and checks its values (no torch), ``filters.py``
holds the logit filters as small pure functions (temperature, top-k, top-p, min-p, penalties),
``numerics.py`` softmax / log-softmax and the logits checks, ``chain.py`` runs them in order and
draws a token, ``defaults.py`` says where a call's settings come from (the caller, a model's
generation_config.json, clearlm's defaults), and ``grammar.py`` holds structured output's one
stateful piece: a sequence's position in a grammar (on llguidance), whose mask of allowed
tokens the chain's ``grammar`` step applies.

May import: ``clearlm.errors``, ``clearlm.config`` and ``clearlm.text`` only (and the
``llguidance`` grammar engine): sampling knows nothing about models, files or speed.
"""

from clearlm.sampling.params import SamplingParams

__all__ = ["SamplingParams"]
