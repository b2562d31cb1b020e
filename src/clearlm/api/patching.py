"""Activation patching on :class:`clearlm.api.model.Model`: ``model.patch(clean, corrupted, ...)``.

A mixin, as :mod:`clearlm.api.interpret`: it checks what the user typed (prompts of one token
count, single-token answers, hook point names) and hands token ids to
:func:`clearlm.inspect.patching.patch_activations`, which does the runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clearlm.errors import ClearLMError
from clearlm.inspect.patching import (
    BATCH_SIZE,
    PatchResult,
    as_index,
    check_batch_size,
    expand_points,
    patch_activations,
)
from clearlm.inspect.token_pieces import token_pieces

if TYPE_CHECKING:
    import torch

    from clearlm.config import ModelConfig
    from clearlm.model.transformer import Transformer
    from clearlm.tokenizer import Tokenizer


class PatchingMixin:
    """``patch``: the activation-patching grid of a clean/corrupted pair of prompts."""

    if TYPE_CHECKING:
        transformer: Transformer
        tokenizer: Tokenizer
        config: ModelConfig

        def encode(self, prompt: str | Sequence[int]) -> list[int]: ...
        def _ids_tensor(self, prompt: str | Sequence[int]) -> torch.Tensor: ...

    def patch(
        self,
        clean: str | Sequence[int],
        corrupted: str | Sequence[int],
        hook_points: str | Sequence[str] = "resid_pre",
        positions: int | Sequence[int] | None = None,
        *,
        answer: str | int,
        wrong: str | int,
        batch_size: int = BATCH_SIZE,
    ) -> PatchResult:
        """Activation patching (Wang et al. 2022; Heimersheim & Nanda 2024): run the corrupted
        prompt with one activation at a time taken from the clean run, and report how much of
        the clean answer each one brings back.

        LD = logit[answer] − logit[wrong] at the last position; for each hook point and
        position, recovery = (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted): 1 when
        that activation carries the whole difference, 0 when it carries none.

        Args:
            clean, corrupted: text or token ids, the same number of tokens.
            hook_points: names (``blocks.3.attn.out``) or per-block kinds (``resid_pre``,
                ``attn.out``, ``ffn.out``: every block's), one or a list.
            positions: token positions to patch (negative counts from the end), a list or
                one position; ints or integer scalars (numpy's, torch's); None: all.
            answer, wrong: one token each, as text (``" Paris"``: the leading space is part
                of the token) or an id (an int or integer scalar).
            batch_size: patched runs per forward pass, ≥ 1 (memory vs speed; the same grid).

        Returns:
            :class:`~clearlm.inspect.patching.PatchResult`: ``recovery`` (P, Q) float32,
            the logit differences, the tokens; ``.table()``, ``.to_dict()``.

        Raises:
            ClearLMError (one line): prompts of different token counts, an answer that is not
            one token, answer = wrong, an unknown hook point or one named twice, no positions
            or one out of range, a batch_size that is not a whole number ≥ 1, the same logit
            difference for both prompts. ContextLengthError: an empty or too-long
            prompt.
        """
        batch_size = check_batch_size(batch_size)
        inputs = self.patch_inputs(clean, corrupted, hook_points, positions, answer, wrong)
        return patch_activations(
            self.transformer, *inputs, batch_size=batch_size,
            text=lambda ids: token_pieces(self.tokenizer, ids),
        )  # fmt: skip

    def patch_inputs(
        self,
        clean: str | Sequence[int],
        corrupted: str | Sequence[int],
        hook_points: str | Sequence[str],
        positions: int | Sequence[int] | None,
        answer: str | int,
        wrong: str | int,
        *,
        token_ids: bool = True,
    ) -> tuple[list[int], list[int], list[str], list[int], int, int]:
        """:meth:`patch`'s arguments checked and resolved, without running anything (the
        tokenizer and config only: the CLI checks them before reading the weights).
        ``token_ids``: whether answer and wrong may be ids (the CLI takes text only, and its
        messages say so).

        Returns:
            (clean ids, corrupted ids, hook point names, positions in [0, T), answer id,
            wrong id). Raises what :meth:`patch` raises for bad input.
        """
        clean_ids = self._ids_tensor(clean)[0].tolist()
        bad_ids = self._ids_tensor(corrupted)[0].tolist()
        if len(clean_ids) != len(bad_ids):
            raise ClearLMError(
                f"the clean prompt is {len(clean_ids)} tokens and the corrupted one "
                f"{len(bad_ids)}; patching swaps activations position by position, so both need "
                f"the same count (clean {self._pieces(clean_ids)}, corrupted "
                f"{self._pieces(bad_ids)})"
            )
        answer_id = self._one_token(answer, "answer", token_ids)
        wrong_id = self._one_token(wrong, "wrong", token_ids)
        if answer_id == wrong_id:
            raise ClearLMError(f"answer and wrong are the same token ({answer_id}); give two")
        points = expand_points(hook_points, self.config.n_layers)
        where = self._positions(positions, len(clean_ids))
        return clean_ids, bad_ids, points, where, answer_id, wrong_id

    def _pieces(self, ids: list[int]) -> str:
        return "|".join(token_pieces(self.tokenizer, ids))

    def _one_token(self, token: str | int, what: str, ids_ok: bool = True) -> int:
        """A token id from text that is exactly one token, or (``ids_ok``) an id in the
        vocabulary (an int or integer scalar)."""
        index = as_index(token) if ids_ok else None
        if index is not None:
            if not 0 <= index < self.config.vocab_size:
                V = self.config.vocab_size
                raise ClearLMError(f"{what} token id {index} is outside the vocabulary [0, {V})")
            return index
        if not isinstance(token, str):
            raise ClearLMError(f"{what} is one token, as text or an id; got {token!r}")
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ClearLMError(
                f"{what} {token!r} is {len(ids)} tokens ({self._pieces(ids) or 'none'}); give "
                "one token (a leading space is part of a token: ' Paris')"
                + (", or its id as an int" if ids_ok else "")
            )
        return ids[0]

    @staticmethod
    def _positions(positions: object, T: int) -> list[int]:
        """Positions in [0, T) from None (all), one position or a list of them, each in
        [−T, T) (an int or integer scalar); ClearLMError for anything else or an empty list."""
        if positions is None:
            return list(range(T))
        if as_index(positions) is not None:
            positions = [positions]  # one position
        if isinstance(positions, str | bytes) or not hasattr(positions, "__iter__"):
            raise ClearLMError(f"positions are a list of token positions, got {positions!r}")
        out = []
        for p in positions:  # type: ignore[attr-defined]
            i = as_index(p)
            if i is None or not -T <= i < T:
                raise ClearLMError(
                    f"position {p!r} is outside the prompt's {T} tokens (0 to {T - 1})"
                    if i is not None else f"a position is a whole number, got {p!r}"
                )  # fmt: skip
            out.append(i % T)
        if not out:
            raise ClearLMError(f"no positions to patch; give some of 0 … {T - 1}, or None: all")
        return out
