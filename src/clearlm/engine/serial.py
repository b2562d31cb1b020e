"""The simplest :class:`~clearlm.engine.Engine`: one request at a time, first come first served.

Each ``step()`` produces one token of the request at the head of the queue, with the
single-sequence code of :mod:`clearlm.generation.loop` (``prefill`` on its first step, then
``decode_step`` against its own KV cache) and the sampling chain of :mod:`clearlm.sampling.chain`
(its own seeded generator), so its tokens are exactly those of ``model.generate`` with the same
settings. It is the server's fallback engine and the "unbatched run" the batched engine is
checked against; it batches nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from clearlm.engine import Request, TokenEvent, failed
from clearlm.engine.running import top_alternatives
from clearlm.errors import GrammarError, SamplingError, SamplingParamsError
from clearlm.generation.loop import check_fits, decode_step, new_cache, prefill
from clearlm.generation.stops import finish_reason
from clearlm.model.kv_cache import KVCache
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import filter_logits, make_generator, pick
from clearlm.sampling.params import check_logit_bias


@dataclass
class _Running:
    """The request being generated: its cache, token history and sampler state."""

    request: Request
    n_new: int  # tokens it will produce at most: max_new_tokens, or what the context leaves
    cache: KVCache
    generator: torch.Generator | None
    seq: torch.Tensor  # (1, P + generated) int64: the penalties' history
    generated: list[int] = field(default_factory=list)


class SerialEngine:
    """Run requests one after another (FIFO), one token per ``step()``.

    Args:
        model: the Transformer (its ``config.context_length`` bounds every request).
        eos_ids: the tokenizer's end ids: a request ends ("eos") when it samples one.
    """

    def __init__(self, model: Transformer, eos_ids: Collection[int]) -> None:
        self.model = model
        self.eos_ids = frozenset(eos_ids)
        self.queue: deque[Request] = deque()
        self.running: _Running | None = None

    def add(self, request: Request) -> None:
        """Queue ``request``.

        Raises:
            ContextLengthError: an empty prompt, or one that leaves no room for a token.
            SamplingParamsError: max_new_tokens < 1, top_logprobs < 0, a duplicate id, or a
                token id (of the prompt or of logit_bias) outside the vocabulary.
        """
        n, vocab = request.max_new_tokens, self.model.config.vocab_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SamplingParamsError(f"max_new_tokens must be an integer ≥ 1, got {n!r}")
        if request.top_logprobs < 0:
            raise SamplingParamsError(f"top_logprobs must be ≥ 0, got {request.top_logprobs}")
        if any(not 0 <= t < vocab for t in request.prompt):
            raise SamplingParamsError(f"a prompt token id is outside the vocabulary [0, {vocab})")
        live = [r.request_id for r in self.queue]
        if self.running is not None:
            live.append(self.running.request.request_id)
        if request.request_id in live:
            raise SamplingParamsError(f"request id {request.request_id!r} is already running")
        check_logit_bias(request.params.logit_bias, vocab)
        check_fits(len(request.prompt), self.model.config.context_length)
        self.queue.append(request)

    def abort(self, request_id: str) -> None:
        """Drop the request (running or queued); its cache is freed now. Unknown ids are ignored
        (the request may have just finished)."""
        if self.running is not None and self.running.request.request_id == request_id:
            self.running = None
        self.queue = deque(r for r in self.queue if r.request_id != request_id)

    def has_work(self) -> bool:
        """Whether a request is running or queued."""
        return self.running is not None or bool(self.queue)

    def step(self) -> list[TokenEvent]:
        """One token of the running request (starting the next queued one if none runs)."""
        if self.running is None:
            if not self.queue:
                return []
            self.running = self._start(self.queue.popleft())
        run = self.running
        if run.generated:  # the previous token against the cache: (1, 1) → (1, V)
            logits = decode_step(self.model, run.seq[:, -1:], run.cache)
        else:  # the whole prompt: (1, P) → (1, V)
            logits = prefill(self.model, run.seq, run.cache)
        try:
            event = self._pick(run, logits)
        except (GrammarError, SamplingError) as e:  # this request alone failed; the next goes on
            event = failed(run.request.request_id, e)
        if event.finish_reason is not None:
            self.running = None
        return [event]

    def _pick(self, run: _Running, logits: torch.Tensor) -> TokenEvent:
        """The running request's next token from its logits (1, V) and its finish reason."""
        req = run.request
        gen = run.seq[:, run.seq.shape[1] - len(run.generated) :]  # (1, G)
        allowed = None if req.grammar is None else req.grammar.allowed()  # (V,) bool
        filtered = filter_logits(logits, run.seq, req.params, gen, allowed)  # (1, V) float32
        token, logprob = pick(filtered, req.params, run.generator)  # (1,), (1,)
        top: list[tuple[int, float]] = []
        if req.top_logprobs:
            top = top_alternatives(logits[0], filtered[0], req.top_logprobs)
        tok = int(token[0])
        run.generated.append(tok)
        run.seq = torch.cat([run.seq, token.view(1, 1)], dim=1)  # (1, P + G + 1)
        n, p = len(run.generated), len(req.prompt)
        eos = () if req.params.ignore_eos else self.eos_ids  # ignore_eos: an end id is a token
        done = False
        if req.grammar is not None and tok not in eos:
            req.grammar.advance(tok)
            done = req.grammar.is_done()
        # the slot holds prompt + n_new tokens (n_new: capped by the context length)
        reason = finish_reason(tok, eos, n, req.max_new_tokens, p + n, p + run.n_new, done)
        return TokenEvent(req.request_id, tok, float(logprob[0]), top, reason)

    def _start(self, req: Request) -> _Running:
        """Allocate the request's cache (prompt + the tokens it may generate) and sampler."""
        n_new = min(req.max_new_tokens, self.model.config.context_length - len(req.prompt))
        cache = new_cache(self.model, 1, len(req.prompt) + n_new)
        seq = torch.tensor([req.prompt], dtype=torch.long)  # (1, P)
        device = self.model.device  # (compact weights: a QuantEmbedding has no .weight)
        generator = None if req.params.is_greedy else make_generator(req.params.seed, device)
        return _Running(req, n_new, cache, generator, seq)
