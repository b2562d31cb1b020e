"""TokenTable: a vocabulary's token strings (id → token) kept as one UTF-8 buffer and offsets.

A Python list of 262,144 ``str`` (Gemma 3's vocabulary) costs ~22 MiB for as long as the model
lives (~60 bytes per object and pointer, for tokens of ~6 bytes); the same strings as one bytes
object and an int64 offset array take 4.2 MiB. ``Tokenizer.tokens`` is read one id at a time
(``id_to_token``, the inspection views), so decoding a token on each read costs nothing that
shows.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np


class TokenTable(Sequence[str]):
    """A read-only sequence of token strings, ``table[i]`` the string of token id ``i``.

    Built by :meth:`of` from any iterable of ``str``; behaves as the list it replaces:
    ``len``, integer indexing (negative from the end), slicing (a ``list``), iteration and
    equality with another sequence of the same strings.

    Raises:
        IndexError: an id outside ``[-len, len)`` (as a list does).
        TypeError: an index that is neither an int nor a slice.
    """

    __slots__ = ("_blob", "_ends")

    def __init__(self, blob: bytes, ends: np.ndarray) -> None:
        self._blob = blob  # every token's UTF-8 bytes, back to back
        self._ends = ends  # (V,) int64: token i is blob[ends[i - 1]:ends[i]] (token 0 from 0)

    @classmethod
    def of(cls, tokens: Iterable[str]) -> TokenTable:
        """The table of ``tokens`` (each kept as UTF-8, a lone surrogate included)."""
        encoded = [t.encode("utf-8", "surrogatepass") for t in tokens]
        ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)))
        return cls(b"".join(encoded), ends)

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i, n = operator.index(i), len(self._ends)  # TypeError for a float, as a list
        if not -n <= i < n:
            raise IndexError(f"token id {i} out of range for a vocabulary of {n}")
        i %= n
        start = int(self._ends[i - 1]) if i else 0
        return self._blob[start : int(self._ends[i])].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        start = 0
        for end in self._ends.tolist():
            yield self._blob[start:end].decode("utf-8", "surrogatepass")
            start = end

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking equality, as a list

    def __repr__(self) -> str:
        return f"TokenTable({len(self)} tokens, {len(self._blob)} bytes)"

    @property
    def nbytes(self) -> int:
        """Bytes the table holds: the UTF-8 buffer plus the offsets."""
        return len(self._blob) + self._ends.nbytes
