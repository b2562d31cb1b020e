"""Token ids → text for one sequence: streaming detokenization, end ids and stop strings.

Shared by single-sequence generation (clearlm.generation.loop.stream_generate), batched generation
and the HTTP server, so the text a sequence shows never depends on how it was scheduled.
"""

from __future__ import annotations

from collections.abc import Sequence

from clearlm.tokenizer import StreamingDetokenizer, Tokenizer


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` could be the start of a stop string."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


class TextStream:
    """Turn one sequence's tokens into the text to show, finding where it must end.

    Stop strings are matched on the decoded text, so one that spans several tokens is found;
    it is not included in the output. Text that might be the beginning of a stop string is held
    back until it is clear that it is not.

    Args:
        tokenizer: the model's tokenizer (its ``eos_ids`` end the text).
        stop: stop strings (empty ones are ignored).
        ignore_eos: end ids do not end the text (``SamplingParams.ignore_eos``): they are
            decoded like any token.
    """

    def __init__(
        self, tokenizer: Tokenizer, stop: Sequence[str] = (), ignore_eos: bool = False
    ) -> None:
        self.eos_ids = frozenset() if ignore_eos else tokenizer.eos_ids
        self.stops = [s for s in stop if s]
        self.detok = StreamingDetokenizer(tokenizer)
        self.pending = ""  # decoded text not yet shown: it may still turn into a stop string

    def add(self, token: int) -> tuple[str, str | None]:
        """Feed one generated token; return (text to show now, finish reason or None).

        The reason is "eos" when `token` is an end id (its text is not shown) and "stop" when a
        stop string appeared (the text up to it is returned); after either, feed no more.
        """
        if token in self.eos_ids:
            return self.finish(), "eos"
        self.pending += self.detok.add(token)
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, "stop"
        keep = held_back(self.pending, self.stops)
        cut = len(self.pending) - keep
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, None

    def finish(self) -> str:
        """The text still held back (a possible stop prefix, partial characters), flushed."""
        out, self.pending = self.pending + self.detok.flush(), ""
        return out
