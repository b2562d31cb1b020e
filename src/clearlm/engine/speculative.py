"""The one-at-a-time engine with speculative decoding: what ``clearlm serve --draft MODEL`` or
``--prompt-lookup`` runs.

Speculation checks a few drafted tokens of one sequence per forward pass; the continuous-
batching engine instead puts one token of many sequences in each pass, and both at once would
need a per-row number of drafted tokens and a per-row rollback. So with a drafter the server
serves requests one after another, first come first served (as :class:`SerialEngine`), each
decoded by :func:`clearlm.generation.speculative.speculative_steps`: greedy requests get the
tokens of plain decoding, sampled ones plain sampling's distribution. ``step()`` hands out one
token; a verify pass runs when the tokens it kept have all been handed out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

import torch

from clearlm.engine import Request, TokenEvent
from clearlm.engine.serial import SerialEngine
from clearlm.generation.drafters import SpeculativeStats
from clearlm.generation.speculative import Drafter, speculative_steps
from clearlm.generation.stops import finish_reason
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import log_softmax


@dataclass
class _Speculating:
    """The request being generated: its token source and how many tokens it has had."""

    request: Request
    n_new: int  # tokens it will produce at most: max_new_tokens, or what the context leaves
    steps: Iterator[tuple[int, torch.Tensor]]
    n: int = 0


class SpeculativeEngine(SerialEngine):
    """Requests one at a time, each decoded speculatively with ``drafter``.

    Args:
        model: the target Transformer.
        eos_ids: the tokenizer's end ids ("eos").
        drafter: a drafter of :mod:`clearlm.generation.drafters` (it is restarted for each
            request, so one serves them all).

    ``stats`` sums the drafted and kept tokens over every request served.
    """

    def __init__(self, model: Transformer, eos_ids: Collection[int], drafter: Drafter) -> None:
        super().__init__(model, eos_ids)
        self.drafter = drafter
        self.stats = SpeculativeStats()

    def step(self) -> list[TokenEvent]:
        """One token of the running request (starting the next queued one if none runs)."""
        if self.running is None:
            if not self.queue:
                return []
            req = self.queue.popleft()
            n_new = min(req.max_new_tokens, self.model.config.context_length - len(req.prompt))
            steps = speculative_steps(
                self.model, req.prompt, req.params, n_new, self.drafter, self.stats
            )
            self.running = _Speculating(req, n_new, steps)  # type: ignore[assignment]
        run: _Speculating = self.running  # type: ignore[assignment]
        req = run.request
        token, row = next(run.steps)  # row: the target's filtered logits (V,)
        logprobs = log_softmax(row)  # (V,)
        top: list[tuple[int, float]] = []
        if req.top_logprobs:
            values, ids = torch.topk(logprobs, min(req.top_logprobs, row.shape[-1]))  # (k,)
            top = list(zip(ids.tolist(), values.tolist(), strict=True))
        run.n += 1
        p = len(req.prompt)
        reason = finish_reason(token, self.eos_ids, run.n, req.max_new_tokens, p + run.n,
                               p + run.n_new)  # fmt: skip
        if reason is not None:
            run.steps.close()
            self.running = None
        return [TokenEvent(req.request_id, token, float(logprobs[token]), top, reason)]
