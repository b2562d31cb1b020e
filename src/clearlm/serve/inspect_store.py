"""What ``clearlm serve --inspect`` keeps of each completion: its token ids, for ``GET
/v1/inspect/{id}`` (:mod:`clearlm.serve.inspect_view` recomputes the rest).

A :class:`Record` holds, for one response ``id`` (``cmpl-…`` or ``chatcmpl-…``), each prompt's
ids and each choice's generated ids (the end token and a stop string's tokens included, as
``usage.completion_tokens`` counts them), and a digest of the API key that made the request.
Recording copies ids the handler already holds (each choice's token events) when the request
ends, so a request pays one list copy per choice, never anything per step.

While a completion is still being generated its id is *pending* (:meth:`InspectStore.begin`),
so that asking for it too early is told apart from asking for an unknown id (409, not 404).

The :class:`InspectStore` is bounded both ways: at most ``keep`` records (the least recently
used goes first) and none older than ``ttl_s`` seconds. Ids are kept as ``array('q')``, 8
bytes a token, so the memory is at most about ``keep × (prompt + every choice's generated
tokens) × 8`` bytes plus ~1 KB per record (the id, the digest, the arrays' headers): with one
choice, ``keep × max_seq_len × 8`` (256 × 2048 × 8 = 4 MiB at the defaults).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_KEEP = 256
DEFAULT_TTL_S = 3600.0
RECORD_OVERHEAD = 1024  # bytes per record beside its ids (id, digest, arrays, dict entry)


def key_digest(token: bytes | None) -> bytes:
    """SHA-256 of the bearer token a request carried, or of a marker when it carried none (no
    token is never equal to any token), so the store never holds a key itself."""
    return hashlib.sha256(b"none" if token is None else b"bearer " + token).digest()


@dataclass(frozen=True)
class Record:
    """One completion's ids.

    Attributes:
        key: :func:`key_digest` of the request's API key.
        prompts: each prompt's ids, int64 (a chat request has one).
        choices: per choice (``choices[i]`` is the response's choice ``i``): the index of its
            prompt in ``prompts`` and its generated ids, int64.
        created: ``time.monotonic()`` when it was recorded.
    """

    key: bytes
    prompts: tuple[array, ...]
    choices: tuple[tuple[int, array], ...]
    created: float

    def tokens(self) -> int:
        """How many ids it holds (each prompt once)."""
        return sum(len(p) for p in self.prompts) + sum(len(g) for _, g in self.choices)

    def nbytes(self) -> int:
        """Its memory, as the bound counts it: 8 bytes a token plus RECORD_OVERHEAD."""
        return 8 * self.tokens() + RECORD_OVERHEAD


class InspectStore:
    """A bounded, thread-safe map from completion id to :class:`Record`.

    Args:
        keep: most records kept (≥ 1); the least recently used is dropped first.
        ttl_s: seconds a record lives after it was made (> 0).
        clock: the time source (``time.monotonic``; a test passes its own).
    """

    def __init__(
        self,
        keep: int = DEFAULT_KEEP,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if keep < 1 or not ttl_s > 0:
            raise ValueError(f"keep must be >= 1 and ttl_s > 0, got {keep} and {ttl_s}")
        self.keep, self.ttl_s, self.clock = keep, ttl_s, clock
        self._records: OrderedDict[str, Record] = OrderedDict()  # oldest use first
        self._made: OrderedDict[str, float] = OrderedDict()  # the same ids, oldest made first
        # ids still generating: (key digest, when begun), oldest first; put() ends them
        self._pending: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, completion_id: str, key: bytes) -> None:
        """Mark ``completion_id`` as being generated (until :meth:`put` keeps it, or ttl_s
        passes: a request that never ends does not pin its entry)."""
        with self._lock:
            if completion_id not in self._records:
                self._pending[completion_id] = (key, self.clock())

    def in_progress(self, completion_id: str, key: bytes) -> bool:
        """Whether ``completion_id`` is still being generated for this key (False for another
        key's, as :meth:`get` answers None for it)."""
        with self._lock:
            self._expire()
            entry = self._pending.get(completion_id)
            return entry is not None and hmac.compare_digest(entry[0], key)

    def put(
        self,
        completion_id: str,
        key: bytes,
        prompts: Sequence[Sequence[int]],
        choices: Sequence[tuple[int, Sequence[int]]],
    ) -> None:
        """Keep a completion's ids under ``completion_id``; drops the least recently used
        record past ``keep``, and the expired ones."""
        record = Record(
            key,
            tuple(array("q", p) for p in prompts),
            tuple((i, array("q", g)) for i, g in choices),
            self.clock(),
        )
        with self._lock:
            self._pending.pop(completion_id, None)
            self._records[completion_id] = record
            self._records.move_to_end(completion_id)
            self._made.pop(completion_id, None)
            self._made[completion_id] = record.created
            while len(self._records) > self.keep:
                dropped, _ = self._records.popitem(last=False)
                del self._made[dropped]
            self._expire()

    def get(self, completion_id: str, key: bytes) -> Record | None:
        """The record, if it is kept, unexpired and was made with the same key (else None:
        the caller cannot tell another key's record from a missing one)."""
        with self._lock:
            self._expire()
            record = self._records.get(completion_id)
            if record is None or not hmac.compare_digest(record.key, key):
                return None
            self._records.move_to_end(completion_id)
            return record

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._records)

    def nbytes(self) -> int:
        """Memory held by the kept records, as :meth:`Record.nbytes` counts it."""
        with self._lock:
            return sum(r.nbytes() for r in self._records.values())

    def _expire(self) -> None:
        """Drop records older than ttl_s (lock held): from the front of the age order, so a
        request pays for the records it drops, never a scan of them all."""
        cutoff = self.clock() - self.ttl_s
        while self._pending and next(iter(self._pending.values()))[1] <= cutoff:
            self._pending.popitem(last=False)
        while self._made:
            cid, made = next(iter(self._made.items()))
            if made > cutoff:
                break
            del self._made[cid], self._records[cid]
