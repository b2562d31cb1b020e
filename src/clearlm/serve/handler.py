"""Run one HTTP request's choices through the runner and shape the OpenAI response.

A :class:`Session` owns the engine requests of one HTTP request (``n`` of them). Its
:meth:`Session.events` yields each choice's new text as tokens arrive; when it ends, for any
reason (done, a stop string, the client gone, the server stopping), every choice still running
is aborted, which frees its slot before the engine's next step. Non-streaming requests also
watch for the client going away while they wait.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from clearlm.engine import Request, TokenEvent
from clearlm.errors import ClearLMError, GrammarError
from clearlm.serve.choices import Choice
from clearlm.serve.errors import APIError, from_clearlm
from clearlm.serve.logprobs import completion_logprobs
from clearlm.serve.requests import Job
from clearlm.serve.runner import EngineFailed, Item, Runner
from clearlm.serve.tools import parse_tool_calls
from clearlm.tokenizer import Tokenizer

log = logging.getLogger("clearlm.serve")
POLL_S = 0.5  # how often a waiting non-streaming request checks that its client is still there


class Session:
    """The choices of one request and their progress.

    Args:
        runner: the engine's runner.
        job: the checked request.
        tokenizer: for text and logprob pieces.
        kind: "completion" or "chat" (for ids, objects and the log line).
        fingerprint: the ``system_fingerprint`` of every response and chunk.
        on_close: called once with the session when it ends, however it ends (``clearlm serve
            --inspect`` keeps its ids then).
    """

    def __init__(
        self,
        runner: Runner,
        job: Job,
        tokenizer: Tokenizer,
        kind: str,
        fingerprint: str = "",
        on_close: Callable[[Session], None] | None = None,
    ) -> None:
        self.runner, self.job, self.kind, self.fingerprint = runner, job, kind, fingerprint
        self.on_close = on_close
        prefix = "cmpl" if kind == "completion" else "chatcmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.tokenizer, n = tokenizer, len(job.params)
        self.choices = [  # choice i * n + j: prompt i, params j (OpenAI's layout)
            Choice(i * n + j, tokenizer, job.stop, p.ignore_eos)
            for i in range(len(job.prompts)) for j, p in enumerate(job.params)
        ]  # fmt: skip
        self.prompt_of = [c.index // n for c in self.choices]
        for c in self.choices:
            if job.max_new_tokens[self.prompt_of[c.index]] == 0:  # nothing to generate
                c.finish_reason = "length"
        live = [c.index for c in self.choices if c.finish_reason is None]
        self.rids = {f"{self.id}-{k}": k for k in live}
        self.sink: asyncio.Queue[Item] = asyncio.Queue()
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.closed = False

    async def start(self) -> None:
        """Queue the choices in the engine. Raises APIError (400) if it refuses one."""
        job, n = self.job, len(self.job.params)
        reqs = []
        for rid, k in self.rids.items():
            i = self.prompt_of[k]
            reqs.append(Request(rid, list(job.prompts[i]), job.params[k % n],
                                job.max_new_tokens[i], job.top_logprobs,
                                grammar=job.new_grammar()))  # fmt: skip
        loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(self.runner.add, reqs, self.sink, loop)
        except ClearLMError as e:  # the engine's own check of the prompt (its max_seq_len)
            raise from_clearlm(e, "prompt" if self.kind == "completion" else "messages") from None
        except RuntimeError as e:  # stopping
            raise APIError(503, str(e), code="shutting_down", type="server_error") from None

    def choice_failed(self, error: ClearLMError) -> APIError:
        """The request's error when the engine ended one of its choices with ``error``: a
        grammar it cannot follow is the client's (400 naming the grammar's field); logits with
        no possible token, the server's (500). The request's other choices are aborted."""
        if isinstance(error, GrammarError):
            return APIError(400, str(error), self.job.grammar_param, "invalid_value")
        log.warning("%s %s: a choice failed: %s", self.kind, self.id, error)
        return APIError(500, f"the engine failed: {error}", code="engine_failed",
                        type="server_error")  # fmt: skip

    def running(self) -> list[str]:
        return [r for r, i in self.rids.items() if self.choices[i].finish_reason is None]

    async def events(
        self, gone: Callable[[], Awaitable[bool]] | None = None
    ) -> AsyncIterator[tuple[Choice, TokenEvent, str]]:
        """Yield (choice, event, new text) until every choice has finished.

        Raises APIError if the engine failed (500) or ended a choice with an error
        (:meth:`choice_failed`). ``gone`` (asked every POLL_S seconds,
        whether tokens are arriving or not) says whether the client disconnected; then the
        choices are aborted and the iteration ends."""
        next_check = time.monotonic() + POLL_S
        try:
            while self.running():
                try:
                    item = await asyncio.wait_for(self.sink.get(), POLL_S)
                except TimeoutError:
                    item = None
                # on the clock, not only when the queue is idle: a busy engine fills it faster
                # than POLL_S, and a request whose client left kept its slot to max_tokens
                if gone is not None and time.monotonic() >= next_check:
                    next_check = time.monotonic() + POLL_S
                    if await gone():
                        return
                if item is None:
                    continue
                if isinstance(item, EngineFailed):
                    raise APIError(item.status, item.message, code=item.code, type="server_error")
                choice = self.choices[self.rids[item.request_id]]
                if choice.finish_reason is not None:
                    continue  # tokens made after a stop string, before the abort took effect
                if item.error is not None:  # this choice alone failed in the engine
                    choice.finish_reason = "error"
                    raise self.choice_failed(item.error)
                if self.t_first is None:
                    self.t_first = time.perf_counter()
                text = choice.add(item)
                if choice.finish_reason is not None and item.finish_reason is None:
                    self.runner.abort([item.request_id])  # a stop string or an end token
                yield choice, item, text
        finally:
            self.close()

    def close(self) -> None:
        """Abort the choices still running, write the log line and call ``on_close`` (once)."""
        self.runner.abort(self.running())
        if not self.closed:
            self.closed = True
            self.log()
            if self.on_close is not None:
                self.on_close(self)

    def usage(self) -> dict[str, int]:
        """Exact token counts: each prompt once, and every token each choice generated."""
        prompt = sum(len(p) for p in self.job.prompts)
        completion = sum(len(c.events) for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def log(self) -> None:
        """One line per request: tokens in and out, time to first token (queueing and prefill
        included), the decode rate after it (tokens after the first ÷ seconds since it: what
        a client sees stream; 0 for a single token), and each choice's finish reason as the
        client receives it (:meth:`sent_finish`)."""
        now = time.perf_counter()
        u = self.usage()
        first = self.t_first or now
        after = u["completion_tokens"] - len(self.choices)  # each choice's first token excluded
        rate = after / (now - first) if now > first and after > 0 else 0.0
        reasons = ",".join(self.sent_finish(c) for c in self.choices)
        log.info(
            "%s %s prompt_tokens=%d completion_tokens=%d ttft=%.3fs decode %.1f tokens/s "
            "finish=%s", self.kind, self.id, u["prompt_tokens"], u["completion_tokens"],
            first - self.t0, rate, reasons,
        )  # fmt: skip

    def sent_finish(self, choice: Choice) -> str:
        """The finish_reason the client gets for ``choice`` ("tool_calls" where its text holds
        calls: :meth:`message`), "error" for a choice the engine failed, "aborted" for one
        that never finished (the client left)."""
        if choice.finish_reason == "stop" and self.job.tools:
            self.message(choice)
        return choice.finish_reason or "aborted"

    # --- response shapes ---------------------------------------------------------------

    def header(self, model: str) -> dict[str, Any]:
        obj = "text_completion" if self.kind == "completion" else "chat.completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": model,
                "system_fingerprint": self.fingerprint}  # fmt: skip

    def logprobs(self, choice: Choice, events: list[TokenEvent], prompt: bool = False) -> Any:
        """The ``logprobs`` of ``events``; with ``prompt``, the scored prompt's entries first."""
        if not self.job.logprobs:
            return None
        if self.kind == "chat":
            return choice.chat_logprobs(events)
        i = self.prompt_of[choice.index]
        scored = self.job.scored[i] if prompt and self.job.scored else None
        return completion_logprobs(self.tokenizer, scored, events, self.job.echo[i])

    def final(self, model: str) -> dict[str, Any]:
        """The whole (non-streaming) response."""
        out = []
        for c in self.choices:
            lp = self.logprobs(c, c.events, prompt=True)
            if self.kind == "completion":
                text = self.job.echo[self.prompt_of[c.index]] + c.text
                out.append({"index": c.index, "text": text, "logprobs": lp,
                            "finish_reason": c.finish_reason})  # fmt: skip
            else:
                msg = self.message(c)
                out.append({"index": c.index, "message": msg, "logprobs": lp,
                            "finish_reason": c.finish_reason})  # fmt: skip
        return {**self.header(model), "choices": out, "usage": self.usage()}

    def message(self, choice: Choice) -> dict[str, Any]:
        """A finished chat choice's message; with tools, its calls parsed out of the text
        (:func:`clearlm.serve.tools.parse_tool_calls`), and then finish_reason "tool_calls"."""
        if not self.job.tools:
            return {"role": "assistant", "content": choice.text}
        content, calls = parse_tool_calls(choice.text, self.job.tools)
        if not calls:
            return {"role": "assistant", "content": content}
        if choice.finish_reason == "stop":
            choice.finish_reason = "tool_calls"
        return {"role": "assistant", "content": content, "tool_calls": calls}

    def tool_chunk(self, model: str, choice: Choice) -> str:
        """With tools, a streamed chat choice's whole answer in one chunk, at its end (the text
        must be complete to tell calls from content): content, and calls with their index."""
        msg = self.message(choice)
        delta: dict[str, Any] = {"content": msg["content"]}
        if "tool_calls" in msg:
            delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]
        body = {"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}
        return sse({**self.header(model), "object": "chat.completion.chunk", "choices": [body]})

    def chunk(
        self, model: str, choice: Choice, ev: TokenEvent | None, text: str, last: bool = False
    ) -> str:
        """One server-sent event for a streamed piece of ``choice``: its new text and the
        token's logprobs, or (``last``) the choice's own closing chunk: no text (chat: an empty
        ``delta``), no logprobs, only ``finish_reason``, as OpenAI and llama-server send it."""
        finish = choice.finish_reason if last else None
        lp = self.logprobs(choice, [ev]) if ev is not None and not last else None
        if self.kind == "completion":
            body: dict[str, Any] = {"index": choice.index, "text": text, "logprobs": lp,
                                    "finish_reason": finish}  # fmt: skip
            head = self.header(model)
        else:
            delta = {} if last else {"content": text}
            body = {"index": choice.index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            head = {**self.header(model), "object": "chat.completion.chunk"}
        return sse({**head, "choices": [body]})

    async def stream(self, model: str) -> AsyncIterator[str]:
        """The server-sent events of a streaming response, ``data: [DONE]`` last."""
        head = {**self.header(model)}
        for c in self.choices:
            if self.kind == "chat":  # OpenAI's first chunk gives the role
                head["object"] = "chat.completion.chunk"
                delta = {"role": "assistant", "content": ""}
                first = {"index": c.index, "delta": delta, "logprobs": None, "finish_reason": None}
                yield sse({**head, "choices": [first]})
            elif self.job.echo[self.prompt_of[c.index]]:
                lp = self.logprobs(c, [], prompt=True)
                body = {"index": c.index, "text": self.job.echo[self.prompt_of[c.index]],
                        "logprobs": lp, "finish_reason": None}  # fmt: skip
                yield sse({**head, "choices": [body]})
            if c.finish_reason is not None:  # max_tokens 0: nothing will come
                yield self.chunk(model, c, None, "", last=True)
        try:
            async for choice, ev, text in self.events():
                if self.job.tools:  # the answer goes whole, at its end
                    if choice.finish_reason is not None:
                        yield self.tool_chunk(model, choice)
                        yield self.chunk(model, choice, None, "", last=True)
                    continue
                if text or self.job.logprobs:
                    yield self.chunk(model, choice, ev, text)
                if choice.finish_reason is not None:
                    yield self.chunk(model, choice, None, "", last=True)
        except APIError as e:  # the engine failed mid-stream: say so in the stream
            yield sse(e.body())
            return
        if self.job.include_usage:
            obj = "text_completion" if self.kind == "completion" else "chat.completion.chunk"
            yield sse({**self.header(model), "object": obj, "choices": [], "usage": self.usage()})
        yield "data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> str:
    """One server-sent event: ``data: {json}`` and a blank line."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
