"""One choice of a response: tokens in, text, logprobs and ``finish_reason`` out.

Text comes from :class:`~clearlm.generation.text_stream.TextStream` (streaming detokenization, end
ids,
stop strings), the same class ``model.generate`` uses, so a choice's text equals the API's.
``finish_reason`` is OpenAI's: "stop" (an end token or a stop string) or "length" (max_tokens,
or the context window is full). Logprobs are the engine's: log-probabilities under the
distribution the token was drawn from (after the sampling settings); an alternative the
settings removed has probability 0 and is reported as -9999.0, as OpenAI does, since JSON has
no -infinity. ``top_logprobs`` always lists as many alternatives as asked (the removed ones
after the kept ones, in the model's order: :func:`clearlm.engine.running.top_alternatives`);
completions' ``top_logprobs`` also hold the sampled token (OpenAI: "up to logprobs + 1
elements"), so ``logprobs: 0`` gives the sampled token alone (:mod:`clearlm.serve.logprobs`
shapes them, with the prompt's when it is scored). Every generated token is listed,
the end token and the tokens of a stop string included, so there are
``usage.completion_tokens`` entries.
"""

from __future__ import annotations

from typing import Any

from clearlm.engine import TokenEvent
from clearlm.generation.text_stream import TextStream
from clearlm.serve.logprobs import finite
from clearlm.tokenizer import Tokenizer


def openai_finish(reason: str) -> str:
    """clearlm's reasons ("eos", "stop", "length", "context_length") as OpenAI's."""
    return "length" if reason in ("length", "context_length") else "stop"


class Choice:
    """The state of one choice while its tokens arrive.

    Args:
        index: the choice's place in ``choices``.
        tokenizer: the model's tokenizer.
        stop: stop strings.
        ignore_eos: end tokens do not end the choice (the request's ``ignore_eos``).
    """

    def __init__(
        self, index: int, tokenizer: Tokenizer, stop: list[str], ignore_eos: bool = False
    ) -> None:
        self.index = index
        self.tokenizer = tokenizer
        self.stream = TextStream(tokenizer, stop, ignore_eos)
        self.text = ""
        self.events: list[TokenEvent] = []
        self.finish_reason: str | None = None

    def add(self, ev: TokenEvent) -> str:
        """Take one token; return the new text to show. Sets ``finish_reason`` when the choice
        is over (by the engine's word or by a stop string / end token found in the text)."""
        self.events.append(ev)
        out, reason = self.stream.add(ev.token)
        if reason is None and ev.finish_reason is not None:
            out += self.stream.finish()
            reason = ev.finish_reason
        if reason is not None:
            self.finish_reason = openai_finish(reason)
        self.text += out
        return out

    def piece(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def chat_logprobs(self, events: list[TokenEvent]) -> dict[str, Any]:
        """The chat ``logprobs`` object (``content``: one entry per token) for ``events``."""

        def entry(token: int, lp: float) -> dict[str, Any]:
            raw = self.tokenizer.token_bytes(token)
            return {"token": self.piece(token), "logprob": finite(lp), "bytes": list(raw)}

        return {
            "content": [
                {
                    **entry(e.token, e.logprob),
                    "top_logprobs": [entry(t, v) for t, v in e.top_logprobs],
                }
                for e in events
            ],
            "refusal": None,
        }
