"""The continuous-batching engine: many requests share one slot KV cache, one step at a time.

A request takes a free slot of the cache (clearlm.model.kv_cache) when it is admitted and gives it
back the moment it finishes or is aborted, so a queued request starts at the next step
(continuous batching, as vLLM's and llama.cpp's servers do). One :meth:`BatchEngine.step`:

1. **admit** queued requests into free slots (lowest slot first), oldest first;
2. **decode** every request that has a token to feed, in one forward pass: batch row b is slot
   b, for b up to the highest such slot; free slots and slots still prefilling in between are
   padding rows (position −1: they read nothing useful and write nothing). Each row is
   sampled by its own request's sampler (clearlm.engine.running);
3. **prefill** at most ``prefill_chunk`` prompt tokens, oldest request first: one forward
   pass (one row, at the request's slot) per request touched. A request whose prompt is then
   complete samples its first token; it joins the decode pass from the next step on.

Why prefill chunks and decodes are separate passes: a decode row is one token and a prefill
row is up to ``prefill_chunk``; one pass holding both would pad every decode row to the chunk
length (a chunk's worth of wasted rows per running request). Two passes keep the decode pass
one token per row (the shape a compiled step wants) and bound the time a step spends on
prompts, so running requests advance at every step while a long prompt is prefilled a chunk at
a time. Decode reads the keys [0, n) with n the longest row's length rounded up to
``key_bucket`` (few distinct shapes; see clearlm.model.kv_cache.CacheRows for the measured cost of
reading the whole buffer instead).

The decode pass runs through the model's ``batch_decode_fn`` when one is attached (the compiled
step ``clearlm serve`` attaches: clearlm.runtime.aot_batch; it returns None for a pass it cannot
serve), else through the eager forward; both compute the same logits up to float32 rounding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection

import torch

from clearlm.engine import Request, TokenEvent
from clearlm.engine.running import Running
from clearlm.errors import ClearLMError, ContextLengthError, SamplingParamsError
from clearlm.generation.loop import check_fits, new_cache
from clearlm.model.transformer import Transformer
from clearlm.sampling.params import check_logit_bias, is_int

DEFAULT_MAX_SEQ_LEN = 2048  # tokens per slot when the caller does not say (memory: see KVCache)


class BatchEngine:
    """Serve many token-id requests through one model (implements clearlm.engine.Engine).

    Args:
        model: the Transformer.
        eos_ids: end ids of the model (finish reason "eos"); ``tokenizer.eos_ids``.
        max_batch: cache slots: the most requests running at once (≥ 1).
        max_seq_len: positions per slot (prompt + generated tokens); default the model's
            context length capped at DEFAULT_MAX_SEQ_LEN. Never more than the context length.
        prefill_chunk: the most prompt tokens prefilled per step (≥ 1).
        key_bucket: decode reads keys up to a multiple of this (≥ 1).

    Raises:
        SamplingParamsError: a size is not a positive integer.
    """

    def __init__(
        self,
        model: Transformer,
        eos_ids: Collection[int] = (),
        max_batch: int = 8,
        max_seq_len: int | None = None,
        prefill_chunk: int = 256,
        key_bucket: int = 128,
    ) -> None:
        ctx = model.config.context_length
        max_seq_len = min(ctx, DEFAULT_MAX_SEQ_LEN) if max_seq_len is None else max_seq_len
        sizes = dict(max_batch=max_batch, max_seq_len=max_seq_len)
        sizes.update(prefill_chunk=prefill_chunk, key_bucket=key_bucket)
        for name, value in sizes.items():
            if not is_int(value) or value < 1:
                raise SamplingParamsError(f"{name} must be an integer ≥ 1, got {value!r}")
        self.model = model
        self.eos_ids = frozenset(eos_ids)
        self.max_seq_len = min(max_seq_len, ctx)
        self.prefill_chunk, self.key_bucket = prefill_chunk, key_bucket
        self.cache = new_cache(model, max_batch, self.max_seq_len)
        self.free_slots = list(range(max_batch))  # kept sorted: the lowest slot goes first
        self.queue: deque[Request] = deque()
        self.running: dict[str, Running] = {}  # admission order

    # --- the Engine protocol ---------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request; it is admitted at a later step.

        Raises:
            ClearLMError: the id is already live, or a token id is outside the vocabulary.
            ContextLengthError, SamplingParamsError: as :meth:`check`.
        """
        rid = request.request_id
        if rid in self.running or any(q.request_id == rid for q in self.queue):
            raise ClearLMError(f"request id {rid!r} is already queued or running")
        self.check(request)
        self.queue.append(request)

    def check(self, request: Request) -> None:
        """Raise unless :meth:`add` would take the request (all but the live-id check). Reads
        only the engine's fixed sizes, so another thread may call it while a step runs (the
        server checks a request there, then hands it to the engine thread: clearlm.serve.runner).

        Raises:
            ClearLMError: a token id is outside the vocabulary.
            ContextLengthError: an empty prompt, or one that leaves no room in a slot.
            SamplingParamsError: max_new_tokens < 1 or top_logprobs < 0 (or not ints), or a
                logit_bias id outside the vocabulary.
        """
        if not is_int(request.max_new_tokens) or request.max_new_tokens < 1:
            raise SamplingParamsError(
                f"max_new_tokens must be an integer ≥ 1, got {request.max_new_tokens!r}"
            )
        if not is_int(request.top_logprobs) or request.top_logprobs < 0:
            raise SamplingParamsError(
                f"top_logprobs must be an integer ≥ 0, got {request.top_logprobs!r}"
            )
        check_logit_bias(request.params.logit_bias, self.model.config.vocab_size)
        self.check_prompt(request.prompt)

    def abort(self, request_id: str) -> None:
        """Drop a queued or running request and free its slot now (unknown ids: nothing)."""
        if request_id in self.running:
            self.release(self.running.pop(request_id))
            return
        self.queue = deque(q for q in self.queue if q.request_id != request_id)

    def step(self, emit: Callable[[TokenEvent], None] | None = None) -> list[TokenEvent]:
        """Admit, decode every running sequence once, prefill up to one chunk; the tokens made.

        ``emit``: called with each first token as soon as its prompt is in, and that event is
        then left out of the list returned (the server streams it at once: each prompt is a
        pass of its own, so the first of 8 requests arriving together would otherwise wait for
        the 7 other prefills before its first token left, ~50 to 90 ms each for SmolLM2)."""
        self.admit()
        with torch.inference_mode():
            decoded = self.decode()
            firsts = self.prefill(emit)
        for event in decoded + firsts:
            if event.finish_reason is not None:
                self.release(self.running.pop(event.request_id))
        return decoded if emit is not None else decoded + firsts

    def has_work(self) -> bool:
        """Whether a request is queued or running."""
        return bool(self.queue or self.running)

    # --- the steps -------------------------------------------------------------------------

    def check_prompt(self, prompt: list[int]) -> None:
        """Raise unless the prompt's ids are in the vocabulary and it leaves room for a token."""
        vocab = self.model.config.vocab_size
        bad = [i for i in prompt if not (is_int(i) and 0 <= i < vocab)]
        if bad:
            raise ClearLMError(f"token id {bad[0]!r} is outside the vocabulary [0, {vocab})")
        ctx = self.model.config.context_length
        if self.max_seq_len == ctx:
            check_fits(len(prompt), ctx)
        elif not 0 < len(prompt) < self.max_seq_len:
            check_fits(len(prompt), ctx)  # an empty prompt, or one past the context itself
            raise ContextLengthError(
                f"the prompt has {len(prompt)} tokens but the engine holds {self.max_seq_len} "
                "per sequence (max_seq_len): no room for a new token; shorten the prompt"
            )

    def admit(self) -> None:
        """Move queued requests into free slots, oldest first."""
        while self.queue and self.free_slots:
            request = self.queue.popleft()
            slot = self.free_slots.pop(0)
            self.cache.free(slot)  # length 0: the old sequence's keys are overwritten
            self.running[request.request_id] = Running(request, slot)

    def release(self, seq: Running) -> None:
        """Give a finished or aborted request's slot back."""
        self.cache.free(seq.slot)
        self.free_slots.append(seq.slot)
        self.free_slots.sort()

    def decode(self) -> list[TokenEvent]:
        """One token for every sequence that has one to feed, in one forward pass."""
        rows = [s for s in self.running.values() if s.pending is not None]
        if not rows:
            return []
        B = max(s.slot for s in rows) + 1
        tokens, positions = [[0]] * B, [[-1]] * B  # padding rows: position −1
        for s in rows:
            tokens[s.slot], positions[s.slot] = [s.pending], [s.cached]
        longest = max(s.cached for s in rows) + 1
        n_keys = min(self.max_seq_len, -(-longest // self.key_bucket) * self.key_bucket)
        tokens_t, positions_t = torch.tensor(tokens), torch.tensor(positions)  # (B, 1) each
        # a compiled step where one is attached (clearlm.runtime.aot_batch); None: run eagerly
        step = getattr(self.model, "batch_decode_fn", None)
        logits = None if step is None else step(
            self.model, tokens_t, positions_t, self.cache, n_keys
        )  # fmt: skip
        if logits is None:
            logits = self.model(
                tokens_t, positions_t, cache=self.cache, last_only=True, n_keys=n_keys
            )[:, -1]  # (B, V)
        events = []
        for s in rows:
            s.cached += 1
            events.append(s.sample(logits[s.slot : s.slot + 1], self.eos_ids, self.max_seq_len))
        return events

    def prefill(self, emit: Callable[[TokenEvent], None] | None = None) -> list[TokenEvent]:
        """Up to prefill_chunk prompt tokens, oldest request first (one pass per request); the
        first tokens, each also given to ``emit`` as soon as made."""
        budget, events = self.prefill_chunk, []
        for s in self.running.values():
            if budget == 0:
                break
            if not s.prefilling:
                continue
            start = s.cached
            n = min(budget, len(s.request.prompt) - start)
            chunk = torch.tensor([s.request.prompt[start : start + n]])  # (1, n)
            positions = torch.arange(start, start + n)[None]  # (1, n)
            logits = self.model(
                chunk, positions, cache=self.cache, last_only=True, slot=s.slot, n_keys=start + n
            )[:, -1]  # (1, V)
            s.cached += n
            budget -= n
            if not s.prefilling:  # the prompt is in: its first token
                events.append(s.sample(logits, self.eos_ids, self.max_seq_len))
                if emit is not None:
                    emit(events[-1])
        return events


def build_engine(
    model: Transformer,
    eos_ids: Collection[int],
    max_batch: int = 8,
    max_seq_len: int | None = None,
    prefill_chunk: int = 256,
) -> BatchEngine:
    """The one place an engine is built, for every caller: the server (``clearlm serve``,
    ``create_app``) and a list of prompts (``model.generate([...])``). Today a continuous-
    batching :class:`BatchEngine` over ``max_batch`` KV-cache slots of ``max_seq_len``
    positions each (None: the model's context, at most DEFAULT_MAX_SEQ_LEN), prefilling up to
    ``prefill_chunk`` prompt tokens per step.

    Raises:
        SamplingParamsError: a size that is not a positive int.
    """
    return BatchEngine(
        model, eos_ids, max_batch=max_batch, max_seq_len=max_seq_len, prefill_chunk=prefill_chunk
    )
