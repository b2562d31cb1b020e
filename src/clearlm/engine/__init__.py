"""Serving many sequences at once: the contract between the batch engine and its callers.

The engine deals in token ids only. A caller (``model.generate([...])``, the HTTP server) gives
it :class:`Request` objects, calls ``step()`` in a loop and receives :class:`TokenEvent` objects,
one per sequence that produced a token in that step. Text, detokenization and stop strings are
the caller's side (:class:`clearlm.generation.text_stream.TextStream`): when a stop string
appears, the caller aborts the request, which frees its KV-cache slot at once.

Each request carries its own sampling parameters and seed, so a request's tokens equal those of
the same prompt run alone with the same seed (its sampler owns its own ``torch.Generator``).

``scheduler.py`` is the continuous-batching engine, ``running.py`` its running rows,
``serial.py`` the one-at-a-time engine, ``speculative.py`` the one-at-a-time engine with
speculative decoding (``clearlm serve --draft``), ``batch.py`` a list of prompts run to the
end. May
import generation, model, sampling, tokenizer and errors; the API and the server import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from clearlm.errors import ClearLMError
from clearlm.sampling.grammar import GrammarState
from clearlm.sampling.params import SamplingParams

FINISH_REASONS = ("eos", "stop", "length", "context_length", "abort", "error")


@dataclass
class Request:
    """One sequence to generate.

    Attributes:
        request_id: unique among the engine's live requests.
        prompt: token ids (at least one).
        params: sampling settings, seed included (``params.seed``).
        max_new_tokens: most tokens to generate (≥ 1).
        top_logprobs: how many most-likely alternatives to report per token (0 = none).
        grammar: structured output: this sequence's own grammar state
            (:func:`clearlm.generation.grammar.grammar_state`), which masks every step's
            logits and advances with each token; None for free text.
    """

    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    top_logprobs: int = 0
    grammar: GrammarState | None = None


@dataclass
class TokenEvent:
    """One step's output for one request.

    Attributes:
        request_id: the request it belongs to.
        token: the sampled token id.
        logprob: its log-probability under the sampling distribution (float, nats).
        top_logprobs: (token id, logprob) of the ``top_logprobs`` most likely tokens.
        finish_reason: None while the request goes on; else why it ended with this token:
            "eos" (an end id of the model), "stop" (the request's grammar is complete),
            "length" (max_new_tokens), "context_length" (the context window is full),
            "error" (this sequence alone failed: see ``error``).
        error: with finish_reason "error", why this sequence failed (a
            :class:`~clearlm.errors.GrammarError`: its grammar cannot be followed; a
            :class:`~clearlm.errors.SamplingError`: its logits left no token); then ``token``
            is -1 and ``logprob`` NaN, no part of the output. The other sequences of the batch
            go on.
    """

    request_id: str
    token: int
    logprob: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    error: ClearLMError | None = None


def failed(request_id: str, error: ClearLMError) -> TokenEvent:
    """The event that ends one sequence whose sampling or grammar raised ``error``."""
    return TokenEvent(request_id, -1, float("nan"), [], "error", error)


class Engine(Protocol):
    """What a scheduler of many requests offers its callers (one thread drives it).

    - ``add(request)``: queue a request; it joins the running batch at a later ``step()``.
      Raises ContextLengthError / SamplingParamsError for a request that cannot run, before
      queuing it.
    - ``abort(request_id)``: drop a request (queued or running) and free its slot now.
    - ``step()``: one scheduler iteration (admit, prefill a chunk, decode every running
      sequence); returns the tokens produced.
    - ``has_work()``: whether any request is queued or running.

    Optional (the continuous-batching engine has both; clearlm.serve.runner uses them when
    there): ``check(request)``, add's checks alone, safe to call while a step runs, so the
    server can refuse a bad request without waiting for the step; and ``step(emit)``, which
    hands each first token to ``emit`` as soon as it is made instead of returning it.
    """

    def add(self, request: Request) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list[TokenEvent]: ...

    def has_work(self) -> bool: ...
