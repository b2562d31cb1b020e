"""Activation patching on :class:`clearlm.api.model.Model`: ``model.patch(clean, corrupted, ...)``.

A mixin, as :mod:`clearlm.api.interpret`: it checks what the user typed (prompts of one token
count, single-token answers, hook point names) and hands token ids to
:func:`clearlm.inspect.patching.patch_activations`, which does the runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clearlm.errors import ClearLMError
from clearlm.inspect.patching import BATCH_SIZE, PatchResult, expand_points, patch_activations
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
        positions: Sequence[int] | None = None,
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
            positions: token positions to patch (negative counts from the end); None: all.
            answer, wrong: one token each, as text (``" Paris"``: the leading space is part
                of the token) or an id.
            batch_size: patched runs per forward pass (memory vs speed; the same grid).

        Returns:
            :class:`~clearlm.inspect.patching.PatchResult`: ``recovery`` (P, Q) float32,
            the logit differences, the tokens; ``.table()``, ``.to_dict()``.

        Raises:
            ClearLMError (one line): prompts of different token counts, an answer that is not
            one token, answer = wrong, an unknown hook point, a position out of range, the
            same logit difference for both prompts. ContextLengthError: an empty or too-long
            prompt.
        """
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
        positions: Sequence[int] | None,
        answer: str | int,
        wrong: str | int,
    ) -> tuple[list[int], list[int], list[str], list[int], int, int]:
        """:meth:`patch`'s arguments checked and resolved, without running anything (the
        tokenizer and config only: the CLI checks them before reading the weights).

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
        answer_id, wrong_id = self._one_token(answer, "answer"), self._one_token(wrong, "wrong")
        if answer_id == wrong_id:
            raise ClearLMError(f"answer and wrong are the same token ({answer_id}); give two")
        points = expand_points(hook_points, self.config.n_layers)
        T = len(clean_ids)
        where = list(range(T)) if positions is None else [self._position(p, T) for p in positions]
        return clean_ids, bad_ids, points, where, answer_id, wrong_id

    def _pieces(self, ids: list[int]) -> str:
        return "|".join(token_pieces(self.tokenizer, ids))

    def _one_token(self, token: str | int, what: str) -> int:
        """A token id from text that is exactly one token, or an id in the vocabulary."""
        if isinstance(token, int) and not isinstance(token, bool):
            if not 0 <= token < self.config.vocab_size:
                V = self.config.vocab_size
                raise ClearLMError(f"{what} token id {token} is outside the vocabulary [0, {V})")
            return token
        if not isinstance(token, str):
            raise ClearLMError(f"{what} is one token, as text or an id; got {token!r}")
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ClearLMError(
                f"{what} {token!r} is {len(ids)} tokens ({self._pieces(ids) or 'none'}); give "
                "one token (a leading space is part of a token: ' Paris'), or its id"
            )
        return ids[0]

    @staticmethod
    def _position(p: int, T: int) -> int:
        """A position in [0, T) from p in [−T, T); ClearLMError otherwise."""
        if isinstance(p, bool) or not isinstance(p, int) or not -T <= p < T:
            raise ClearLMError(f"position {p!r} is outside the prompt's {T} tokens (0 to {T - 1})")
        return p % T
