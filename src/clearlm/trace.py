"""The tensors one forward pass recorded at the model's hook points (clearlm.model.hooks)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch


class Trace(Mapping[str, torch.Tensor]):
    """The tensors recorded by one forward pass: ``trace["blocks.0.attn.pattern"]``.

    Also ``trace.tokens`` (the token ids, list[int]) and ``trace.text`` (their strings).
    Shapes are those of clearlm.model.hooks.HOOK_POINTS with B = 1.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], tokens: list[int], text: list[str]):
        self._t, self.tokens, self.text = tensors, tokens, text

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._t:
            raise KeyError(f"{name!r} was not recorded; recorded: {', '.join(list(self._t)[:6])}…")
        return self._t[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._t)

    def __len__(self) -> int:
        return len(self._t)
