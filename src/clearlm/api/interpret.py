"""The interpretability half of :class:`clearlm.api.model.Model`: traces of hook points, hooks (also
as a context manager, as TransformerLens users expect), the logit lens and readable tokens.

A mixin so ``api.py`` keeps to loading and generation; it uses the model's ``transformer``,
``tokenizer``, ``config``, ``encode`` and ``_ids_tensor``. TransformerLens's methods
(run_with_cache, run_with_hooks, to_tokens, cfg) come from :class:`clearlm.api.lens.LensMixin`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from clearlm.api.lens import FwdHooks, LensMixin
from clearlm.inspect.lens_vocab import lens_hooks
from clearlm.inspect.token_pieces import token_pieces
from clearlm.inspect.trace import Trace, lens_names
from clearlm.model.hook_aliases import lens_names_of
from clearlm.model.hooks import HookFn, HookHandle, resolve_names
from clearlm.sampling.chain import softmax

if TYPE_CHECKING:
    from clearlm.config import ModelConfig
    from clearlm.model.transformer import Transformer
    from clearlm.tokenizer import Tokenizer


class InterpretMixin(LensMixin):
    """Hook points, traces, the logit lens and token strings for a loaded model."""

    if TYPE_CHECKING:
        transformer: Transformer
        tokenizer: Tokenizer
        config: ModelConfig

        def encode(self, prompt: str | Sequence[int]) -> list[int]: ...
        def _ids_tensor(self, prompt: str | Sequence[int]) -> torch.Tensor: ...

    def to_str_tokens(
        self, prompt: str | Sequence[int] | torch.Tensor, prepend_bos: bool | None = None
    ) -> list[str]:
        """One readable string per token of the prompt (as TransformerLens's to_str_tokens):
        text, ids, or a (T,) / (1, T) tensor; ``prepend_bos`` as :meth:`to_tokens`. Bytes of a
        partial character show as ``<0xE6>`` (see clearlm.inspect.token_pieces)."""
        return token_pieces(self.tokenizer, self._lens_ids(prompt, prepend_bos))

    @torch.inference_mode()
    def run_with_trace(
        self, prompt: str | Sequence[int], names: Sequence[str] | None = None
    ) -> Trace:
        """One forward pass over the prompt, recording hook points (all of them by default).

        Args:
            prompt: text or token ids.
            names: hook point names (see clearlm.model.hooks.HOOK_POINTS), or None for all.

        Returns:
            A :class:`~clearlm.inspect.trace.Trace`: name → tensor with B = 1 (e.g.
            ``trace["blocks.0.attn.pattern"]`` is (1, H, T, T)), plus ``probs`` (1, T, V)
            float32 and the tokens. Registered hooks run too (an intervention shows up in the
            trace). The tensors are those of the plain forward pass, bit for bit.

        Raises:
            ClearLMError: an unknown hook point name. ContextLengthError: empty/too-long prompt.
        """
        ids = self._ids_tensor(prompt)
        wanted = resolve_names(names, self.config.n_layers)
        with self.transformer.hooks.recording(wanted) as recorded:
            logits = self.transformer(ids)  # (1, T, V)
        if wanted is None or "probs" in wanted:
            recorded["probs"] = softmax(logits.float())
        tokens = ids[0].tolist()
        text = token_pieces(self.tokenizer, tokens)
        return Trace(recorded, tokens, text, self.transformer.unembed)

    def add_hook(self, name: str, fn: HookFn) -> HookHandle:
        """Call fn(tensor, name) whenever the forward pass reaches hook point `name`; if fn
        returns a tensor, it replaces the original (same shape). Returns a handle whose
        ``remove()`` takes the hook away. Raises ClearLMError for an unknown name, or one
        this model lacks (``pos`` with RoPE; ``probs``, computed after the pass).

        Example, ablating head 3 of block 5: ``model.add_hook("blocks.5.attn.z",
        lambda z, _: z.index_fill(2, torch.tensor([3]), 0.0))``.
        """
        return self.transformer.hooks.add(name, fn)

    @contextmanager
    def hooks(
        self, fns: Mapping[str, HookFn] | None = None, *, fwd_hooks: FwdHooks = ()
    ) -> Iterator[InterpretMixin]:
        """``with model.hooks({"blocks.5.attn.z": fn}):`` — hooks that are removed when the
        block ends, also when it raises; fn(tensor, name). TransformerLens's form
        ``with model.hooks(fwd_hooks=[("blocks.5.attn.hook_z", fn)]):`` calls fn(tensor, hook)
        (see :meth:`run_with_hooks`). Raises ClearLMError for an unknown name (none added)."""
        lens = lens_hooks(fwd_hooks, lens_names_of(self.config))
        hooks = self.transformer.hooks
        with hooks.temporary({} if fns is None else fns), hooks.temporary(lens):
            yield self

    def clear_hooks(self) -> None:
        """Remove every hook."""
        self.transformer.hooks.clear()

    def logit_lens(self, prompt: str | Sequence[int], position: int = -1) -> torch.Tensor:
        """The logit lens (nostalgebraist 2020) at `position`, from one traced forward pass:
        :meth:`Trace.logit_lens <clearlm.inspect.trace.Trace.logit_lens>`.

        Returns:
            (N + 1, V) float32 probabilities: row 0 reads what block 0 receives, row i the
            output of block i − 1; the last row is the model's own next-token distribution.
            Raises ContextLengthError for an empty or too-long prompt.
        """
        trace = self.run_with_trace(prompt, names=lens_names(self.config.n_layers))
        return trace.logit_lens(position)  # (N + 1, V)
