"""TransformerLens's methods on :class:`clearlm.api.model.Model`: ``run_with_cache``,
``run_with_hooks``, ``model(tokens)``, ``to_tokens``, ``to_single_token``, ``to_string``, ``cfg``
(``hooks(fwd_hooks=...)`` and ``to_str_tokens`` are in :mod:`clearlm.api.interpret`).

A notebook written for ``HookedTransformer`` runs with ``clearlm.load(...)`` in place of
``HookedTransformer.from_pretrained(...)``: the names and shapes are TransformerLens's
(:data:`clearlm.model.hook_aliases.LENS_NAMES`), the values clearlm's own forward pass (those of
TransformerLens's ``from_pretrained_no_processing``). A mixin: it uses the model's
``transformer``, ``tokenizer``, ``config`` and ``encode``.

Shape letters: B batch rows, T tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from clearlm.errors import ClearLMError
from clearlm.generation.loop import check_fits
from clearlm.inspect.lens_vocab import (
    LensCache,
    LensConfig,
    LensHookFn,
    NameOrFilter,
    lens_hooks,
    names_wanted,
)
from clearlm.model.hook_aliases import lens_names_of
from clearlm.model.hooks import resolve_names
from clearlm.runtime.devices import resolve_device

if TYPE_CHECKING:
    from clearlm.config import ModelConfig
    from clearlm.model.transformer import Transformer
    from clearlm.tokenizer import Tokenizer

Tokens = str | Sequence[str] | Sequence[int] | torch.Tensor
FwdHooks = Iterable[tuple[NameOrFilter, LensHookFn]]


class LensMixin:
    """TransformerLens's names for running a model and reading its activations."""

    if TYPE_CHECKING:
        transformer: Transformer
        tokenizer: Tokenizer
        config: ModelConfig

        def encode(self, prompt: str | Sequence[int]) -> list[int]: ...

    @property
    def cfg(self) -> LensConfig:
        """The sizes under TransformerLens's names (n_layers, d_model, n_heads, d_head, d_mlp,
        d_vocab, n_ctx, ...): :class:`~clearlm.inspect.lens_vocab.LensConfig`."""
        p = next(self.transformer.parameters())
        return LensConfig.of(self.config, self.tokenizer.add_bos, p.device, p.dtype)

    def to_tokens(self, text: str | Sequence[str], prepend_bos: bool | None = None
                  ) -> torch.Tensor:
        """Text → token ids, (1, T) int64 (a list of texts of one length: (B, T)).

        ``prepend_bos``: None follows the file (BOS where its tokenizer adds one, as
        ``model.encode``); True puts the BOS token first; False leaves it out.
        TransformerLens's default is True for every model.

        Raises:
            ClearLMError: texts of different lengths (no padding here), a tokenizer without a
                BOS token asked for one. ContextLengthError: empty or longer than the context.
        """
        if not isinstance(text, str):
            rows = [self._lens_ids(t, prepend_bos) for t in text]
            if not rows or len({len(r) for r in rows}) != 1:
                raise ClearLMError("to_tokens takes texts of one token length (no padding): "
                                   + str([len(r) for r in rows]))
            return torch.tensor(rows, dtype=torch.long)  # (B, T)
        return torch.tensor([self._lens_ids(text, prepend_bos)], dtype=torch.long)  # (1, T)

    def _lens_ids(self, text: str | Sequence[int] | torch.Tensor,
                  prepend_bos: bool | None = None) -> list[int]:
        """One prompt → ids: text as to_tokens (prepend_bos), ids (a list, or a tensor of
        shape (T,) or (1, T)) as given. Raises ClearLMError for a tensor of more rows."""
        if isinstance(text, torch.Tensor):
            if text.dim() > 2 or (text.dim() == 2 and text.shape[0] != 1):
                raise ClearLMError(f"one row of tokens: (T,) or (1, T), got {tuple(text.shape)}")
            return self.encode(text.reshape(-1).tolist())
        ids = self.encode(text)
        if not isinstance(text, str) or prepend_bos is None:
            return ids
        bos = self.tokenizer.bos_id
        has = bool(ids) and ids[0] == bos and self.tokenizer.add_bos  # the BOS encode added
        if prepend_bos and not has:
            if bos is None:
                raise ClearLMError("prepend_bos=True: this model's tokenizer has no BOS token")
            return [bos, *ids]
        return ids[1:] if not prepend_bos and has else ids

    def to_single_token(self, text: str) -> int:
        """The id of a text that is one token (no BOS): ``model.to_single_token(" Paris")``.

        Raises ClearLMError when the text is not exactly one token."""
        ids = self._lens_ids(text, prepend_bos=False)
        if len(ids) != 1:
            raise ClearLMError(f"{text!r} is {len(ids)} tokens, not one: {ids}")
        return ids[0]

    def to_string(self, tokens: Sequence[int] | torch.Tensor) -> str | list[str]:
        """Token ids → text: a string for (T,) ids, a list of strings for (B, T), as
        TransformerLens's to_string (special tokens kept)."""
        t = torch.as_tensor(tokens)
        if t.dim() == 2:
            return [self.tokenizer.decode(row.tolist()) for row in t]
        return self.tokenizer.decode(t.reshape(-1).tolist())

    def _lens_batch(self, tokens: Tokens) -> torch.Tensor:
        """run_with_cache's input → (B, T) int64 on the weights' device: a text, a list of
        texts of one length, ids, or a (T,) / (B, T) tensor (to_tokens' output).

        Raises ClearLMError for ids outside the vocabulary or rows of different lengths,
        ContextLengthError for an empty or too-long row."""
        if isinstance(tokens, torch.Tensor) and tokens.dim() == 2:
            ids = torch.tensor([self.encode(row.tolist()) for row in tokens], dtype=torch.long)
        elif isinstance(tokens, str) or (
            isinstance(tokens, Sequence) and tokens and isinstance(tokens[0], str)
        ):
            ids = self.to_tokens(tokens)  # type: ignore[arg-type]
        else:
            ids = torch.tensor([self._lens_ids(tokens)], dtype=torch.long)  # type: ignore[arg-type]
        check_fits(ids.shape[1], self.config.context_length, new_tokens=0)
        return ids.to(self.transformer.device)  # (B, T)

    @staticmethod
    def _check_return_type(return_type: str | None, ids: torch.Tensor) -> None:
        """ClearLMError, before any run, for an unknown return_type or a loss asked of fewer
        than 2 tokens (no next token to predict: the mean would be NaN)."""
        if return_type not in ("logits", "loss", None):
            raise ClearLMError(f"return_type is 'logits', 'loss' or None, got {return_type!r}")
        if return_type == "loss" and ids.shape[1] < 2:
            raise ClearLMError(
                f"return_type='loss' needs at least 2 tokens (each predicts the next); the "
                f"input is {ids.shape[1]}"
            )

    def _lens_output(self, logits: torch.Tensor, ids: torch.Tensor, return_type: str | None
                     ) -> torch.Tensor | None:
        """The logits (B, T, V), the mean next-token cross-entropy ("loss", a 0-d float32
        tensor, TransformerLens's lm_cross_entropy_loss) or None (_check_return_type first)."""
        if return_type == "loss":
            logp = F.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T - 1, V)
            return -logp.gather(-1, ids[:, 1:, None]).mean()
        return logits if return_type == "logits" else None

    def __call__(self, tokens: Tokens, return_type: str | None = "logits"
                 ) -> torch.Tensor | None:
        """``model(tokens)``, as a HookedTransformer is called: the logits (B, T, V), or the
        loss / None (``return_type``). Same input and errors as :meth:`run_with_hooks`."""
        return self.run_with_hooks(tokens, return_type=return_type)

    @torch.inference_mode()
    def run_with_cache(
        self,
        tokens: Tokens,
        names_filter: NameOrFilter | Sequence[str] | None = None,
        remove_batch_dim: bool = False,
        device: str | torch.device | None = None,
        return_type: str | None = "logits",
    ) -> tuple[torch.Tensor | None, LensCache]:
        """One forward pass, recording activations under TransformerLens's names.

        Args:
            tokens: a text, a list of texts of one token length, ids, or a (B, T) tensor.
            names_filter: None (every TransformerLens name this model has), a name, a list
                of names (TransformerLens's, or clearlm's: kept in clearlm's layout), or a
                function name -> bool over the TransformerLens names.
            remove_batch_dim: drop the batch dimension (batch of one).
            device: where the cache's tensors go (None: the model's device).
            return_type: "logits" ((B, T, V)), "loss" or None.

        Returns:
            (logits, cache): the cache is a :class:`~clearlm.inspect.lens_vocab.LensCache`,
            e.g. ``cache["blocks.0.attn.hook_pattern"]`` or ``cache["pattern", 0]``, (B, H, T, T).
            Hooks added with ``hooks``/``add_hook`` run too; the cache holds their result.

        Raises:
            ClearLMError: an unknown name (the nearest suggested) or one with no clearlm
                equivalent on this model, a loss of a 1-token input. DeviceError: a `device`
                this machine lacks. ContextLengthError: empty or too-long input.
        """
        ids = self._lens_batch(tokens)
        self._check_return_type(return_type, ids)
        if device is not None:
            device = resolve_device(device)  # DeviceError before the pass
        wanted = names_wanted(names_filter, lens_names_of(self.config))
        resolve_names(wanted, self.config.n_layers)  # ClearLMError: unknown, nearest suggested
        with self.transformer.hooks.recording(set(wanted)) as recorded:
            logits = self.transformer(ids)  # (B, T, V)
        cache = {n: recorded[n] if device is None else recorded[n].to(device)
                 for n in wanted if n in recorded}
        out = LensCache(cache, self.config.n_layers)
        if remove_batch_dim:
            out.remove_batch_dim()
        return self._lens_output(logits, ids, return_type), out

    @torch.inference_mode()
    def run_with_hooks(
        self, tokens: Tokens, fwd_hooks: FwdHooks = (), return_type: str | None = "logits",
        **unsupported: Any,
    ) -> torch.Tensor | None:
        """One forward pass with TransformerLens-style hooks added for it alone.

        ``fwd_hooks``: (name or filter, fn) pairs; each fn is called ``fn(activation, hook)``
        with the activation in the name's layout and ``hook.name`` the name; a tensor it
        returns replaces the activation (an in-place edit works too). Returns the logits (B, T,
        V), the loss, or None (``return_type``), as :meth:`run_with_cache`.

        Raises:
            ClearLMError: an unknown name (none is added), a backward hook (clearlm runs
                without gradients) or another option TransformerLens has and clearlm has not.
        """
        if unsupported:
            raise ClearLMError(
                f"run_with_hooks: {', '.join(unsupported)} is not supported (clearlm runs "
                "forward hooks only, without gradients, removed after the pass)"
            )
        ids = self._lens_batch(tokens)
        self._check_return_type(return_type, ids)
        pairs = lens_hooks(fwd_hooks, lens_names_of(self.config))
        with self.transformer.hooks.temporary(pairs):
            logits = self.transformer(ids)  # (B, T, V)
        return self._lens_output(logits, ids, return_type)
