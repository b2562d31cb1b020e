"""One request while it runs in the engine: its slot, its own sampler, what it has generated.

Sampling is per request, exactly as single-sequence generation does it
(clearlm.generation.loop.generate_step): the request's sampler (``make_sampler(params)``, which owns
its own seeded ``torch.Generator``) sees the request's logits (1, V) and its own history, so its
tokens do not depend on which other requests share the batch.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from clearlm.engine import Request, TokenEvent, failed
from clearlm.errors import GrammarError, SamplingError
from clearlm.generation.stops import finish_reason
from clearlm.sampling.chain import filter_logits, log_softmax, make_sampler


class Running:
    """A request that holds a cache slot.

    Attributes:
        request: the request.
        slot: its KV-cache slot.
        cached: positions of the slot filled so far (prompt tokens prefilled, then fed tokens).
        generated: token ids sampled so far; the last one is fed at the next decode step.
    """

    def __init__(self, request: Request, slot: int) -> None:
        self.request = request
        self.slot = slot
        self.cached = 0
        self.generated: list[int] = []
        self.sampler = make_sampler(request.params)
        p = request.params  # a penalty needs the history (OpenAI's two: its generated part)
        self.penalised = p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to be written into the cache."""
        return self.cached < len(self.request.prompt)

    @property
    def pending(self) -> int | None:
        """The token to feed at the next decode step (None while prefilling)."""
        return self.generated[-1] if self.generated else None

    def history(self) -> torch.Tensor | None:
        """(1, P + n) int64 prompt and generated ids, for the penalties (None when all are
        off: the chain then skips them, as it does for inactive ones)."""
        if not self.penalised:
            return None
        return torch.tensor([self.request.prompt + self.generated], dtype=torch.long)

    def sample(
        self, logits: torch.Tensor, eos_ids: Collection[int], max_seq_len: int
    ) -> TokenEvent:
        """Pick the next token from logits (1, V) and say whether the request ends with it.

        Finish reasons, in this order (single-sequence generation's): "eos" (an end id, unless
        the request's params say ``ignore_eos``), "stop" (the request's grammar is complete),
        "length" (max_new_tokens reached), "context_length" (the slot is full: prompt +
        generated tokens fill max_seq_len, so the token cannot be fed). A GrammarError or
        SamplingError of this request alone is an "error" event (:func:`clearlm.engine.failed`):
        the caller ends this request, and the batch goes on.
        """
        try:
            return self._sample(logits, eos_ids, max_seq_len)
        except (GrammarError, SamplingError) as e:
            return failed(self.request.request_id, e)

    def _sample(
        self, logits: torch.Tensor, eos_ids: Collection[int], max_seq_len: int
    ) -> TokenEvent:
        """:meth:`sample`, raising what the sampler or the grammar raise."""
        history, grammar = self.history(), self.request.grammar
        allowed = None if grammar is None else grammar.allowed()  # (V,) bool: this row's mask
        token, logprob = self.sampler(logits, history, allowed)  # (1,), (1,)
        tok = int(token[0])
        top = self.top_logprobs(logits, history, allowed)
        self.generated.append(tok)
        n, req = len(self.generated), self.request
        filled = len(req.prompt) + n
        eos = () if req.params.ignore_eos else eos_ids  # ignore_eos: an end id is a token
        done = False
        if grammar is not None and tok not in eos:
            grammar.advance(tok)
            done = grammar.is_done()
        reason = finish_reason(tok, eos, n, req.max_new_tokens, filled, max_seq_len, done)
        return TokenEvent(self.request.request_id, tok, float(logprob[0]), top, reason)

    def top_logprobs(
        self, logits: torch.Tensor, history: torch.Tensor | None, allowed: torch.Tensor | None
    ) -> list[tuple[int, float]]:
        """The request's ``top_logprobs`` alternatives (:func:`top_alternatives`)."""
        k = self.request.top_logprobs
        if k == 0:
            return []
        generated = None if history is None else history[:, len(self.request.prompt) :]  # (1, n)
        filtered = filter_logits(logits, history, self.request.params, generated, allowed)
        return top_alternatives(logits[0], filtered[0], k)


def top_alternatives(
    logits: torch.Tensor, filtered: torch.Tensor, k: int
) -> list[tuple[int, float]]:
    """The ``k`` alternatives reported for one position, and their logprobs under the sampling
    distribution (softmax of ``filtered``, the distribution the sampled token's logprob is of).

    Always ``min(k, V)`` entries: first the tokens the sampling settings kept, most likely first;
    then, when top-k / top-p / min-p kept fewer than ``k``, the removed ones in the order of the
    model's own ``logits`` (the most likely of them first), with logprob −inf (the server writes
    −9999.0, OpenAI's stand-in). Ties: the lowest id first. ``logits`` and ``filtered`` are
    ``(V,)`` float (before and after :func:`~clearlm.sampling.chain.filter_logits`)."""
    lp = log_softmax(filtered)  # (V,) float32
    kept = torch.isfinite(lp)  # (V,) bool
    order = torch.argsort(lp, descending=True, stable=True)[:k]  # (k,), kept tokens first
    n_kept = int(kept.sum())
    if n_kept < len(order):  # fill with the removed tokens, by the model's own logits
        raw = torch.where(kept, float("-inf"), logits.to(torch.float32))  # (V,)
        removed = torch.argsort(raw, descending=True, stable=True)[: len(order) - n_kept]
        order = torch.cat([order[:n_kept], removed])  # (k,)
    return [(int(i), float(lp[i])) for i in order]
