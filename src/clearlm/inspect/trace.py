"""The tensors recorded by one forward pass, and what is read from them.

:meth:`clearlm.api.model.Model.run_with_trace` records the hook points
(``clearlm.model.hooks.HOOK_POINTS``) of one forward pass into a :class:`Trace`. Every view
reads that one pass: the logit lens
(:meth:`Trace.logit_lens`, computed here and nowhere else), the next-token probabilities
(:attr:`Trace.probs`) and the attention patterns (:meth:`Trace.pattern`), for
``Model.logit_lens``, ``clearlm explain`` and the ui alike.

Shape letters: T prompt tokens, N blocks, H heads, D d_model, V vocab. Recorded tensors have the
shapes of HOOK_POINTS with B = 1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch

from clearlm.sampling.chain import softmax


def lens_names(n_layers: int) -> list[str]:
    """The hook points the logit lens reads: block 0's input, then every block's output."""
    return ["blocks.0.resid_pre"] + [f"blocks.{i}.resid_post" for i in range(n_layers)]


def pattern_names(n_layers: int) -> list[str]:
    """The attention-pattern hook point of every block."""
    return [f"blocks.{i}.attn.pattern" for i in range(n_layers)]


class Trace(Mapping[str, torch.Tensor]):
    """The tensors recorded by one forward pass: ``trace["blocks.0.attn.pattern"]``.

    Also ``trace.tokens`` (the token ids, list[int]) and ``trace.text`` (their strings).
    Shapes are those of HOOK_POINTS with B = 1. ``unembed`` is the model's stage 4 (final norm
    and output projection, (1, T, D) → (1, T, V)), which the logit lens applies.
    """

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        tokens: list[int],
        text: list[str],
        unembed: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self._t, self.tokens, self.text, self._unembed = tensors, tokens, text, unembed

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._t:
            raise KeyError(f"{name!r} was not recorded; recorded: {', '.join(list(self._t)[:6])}…")
        return self._t[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._t)

    def __len__(self) -> int:
        return len(self._t)

    @property
    def probs(self) -> torch.Tensor:
        """P(next token | tokens up to t) at every position: (T, V) float32, the softmax of the
        recorded logits (``self["probs"]`` when run_with_trace recorded it)."""
        if "probs" in self._t:
            return self._t["probs"][0]
        return softmax(self["logits"][0].float())

    def pattern(self, layer: int) -> torch.Tensor:
        """Block ``layer``'s attention weights, (H, T, T) float32: head, query, key."""
        return self[f"blocks.{layer}.attn.pattern"][0].float()

    def patterns(self) -> torch.Tensor:
        """Every recorded block's attention weights stacked, (N, H, T, T) float32."""
        return torch.stack([self.pattern(i) for i in range(self._blocks("attn.pattern"))])

    @torch.inference_mode()
    def logit_lens(self, position: int | None = None) -> torch.Tensor:
        """The logit lens (nostalgebraist 2020): each block's output residual stream, read
        through the final norm and the output projection as if it were the last layer.

        Needs the points of :func:`lens_names` recorded. Row 0 reads what block 0 receives (the
        embeddings, plus additive positions where the model has them), row i the output of
        block i − 1; the last row is the model's own next-token distribution.

        Args:
            position: one position (e.g. -1, the last token), or None for every position.

        Returns:
            float32 probabilities: (N + 1, V) at ``position``, or (N + 1, T, V) when None.

        Raises:
            KeyError: a residual stream was not recorded. ValueError: no unembed was given.
        """
        if self._unembed is None:
            raise ValueError("this trace has no unembed function; make it with run_with_trace")
        names = lens_names(self._blocks("resid_post"))
        resid = torch.stack([self[name][0] for name in names])  # (N + 1, T, D)
        if position is not None:  # unembed only the one position: (N + 1, 1, D)
            return softmax(self._unembed(resid[:, position, None])[:, 0].float())  # (N + 1, V)
        return softmax(self._unembed(resid).float())  # (N + 1, T, V)

    def _blocks(self, point: str) -> int:
        """How many blocks have ``blocks.{i}.<point>`` recorded, counting from block 0."""
        n = 0
        while f"blocks.{n}.{point}" in self._t:
            n += 1
        return n
