"""Drafters for speculative decoding: who guesses the next few tokens that the target checks.

Speculative decoding (Leviathan, Kalman and Matias 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling") lets a cheap drafter propose k tokens; the target model scores them all
in one forward pass and keeps what it agrees with (:mod:`clearlm.generation.speculative`).
Two drafters, each with ``start(prompt, capacity)`` (a new sequence) and
``draft(history, k, filt, draw) -> (ids, q)``:

- :class:`PromptLookup`: n-gram lookup in the tokens so far (Saxena 2023, "Prompt Lookup
  Decoding"; vLLM's speculative method "ngram", transformers' ``prompt_lookup_num_tokens``,
  llama.cpp's lookup decoding). No second model: it pays off when the output repeats its input
  (summaries, edits, code changes).
- :class:`DraftModel`: a smaller model with the same tokenizer (Qwen2.5-Coder-0.5B drafting for
  Qwen2.5-Coder-1.5B), with its own KV cache, rolled back like the target's.

``filt(logits (V,), history) -> (V,)`` float32 is the sampling chain without the pick
(:func:`clearlm.sampling.chain.filter_logits` with that history), ``draw(filtered) -> id`` the
pick; a drafter that samples uses both, so its q is filtered exactly as the target's p.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from clearlm.errors import SamplingParamsError
from clearlm.model.kv_cache import KVCache
from clearlm.model.transformer import Transformer
from clearlm.tokenizer import Tokenizer

Filter = Callable[[torch.Tensor, Sequence[int]], torch.Tensor]  # (V,) logits, history → (V,)
Draw = Callable[[torch.Tensor], int]  # filtered (V,) → token id


@dataclass
class SpeculativeStats:
    """Counts of one speculative generation.

    Attributes:
        steps: forward passes of the target after the prompt (each verifies 0..k drafts).
        drafted: tokens the drafter proposed.
        accepted: drafted tokens the target kept.
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0


def find_continuation(
    history: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1
) -> list[int]:
    """Prompt lookup: the up-to-k tokens that followed the latest earlier occurrence of the
    history's last n tokens, trying n = max_ngram down to min_ngram; [] when none occurs.

    The match must end before the history's last token (its continuation is known text).
    Pure: token ids in, token ids out (as transformers' PromptLookupCandidateGenerator, which
    takes the first occurrence instead: the latest is the one nearest what is being copied)."""
    L = len(history)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        tail = list(history[L - n :])
        for start in range(L - n - 1, -1, -1):  # latest first
            if history[start + n - 1] == tail[-1] and list(history[start : start + n]) == tail:
                return list(history[start + n : start + n + k])
    return []


class PromptLookup:
    """Draft by copying from the text so far (:func:`find_continuation`); q is a point mass on
    each drafted token, so the sampled acceptance rule keeps token x with probability p(x).

    Args:
        num_draft: most tokens drafted per step (k).
        max_ngram, min_ngram: the n-gram lengths matched, longest first.

    Raises:
        SamplingParamsError: a size that is not a positive int, or min_ngram > max_ngram.
    """

    def __init__(self, num_draft: int = 10, max_ngram: int = 3, min_ngram: int = 1) -> None:
        check_positive(num_draft=num_draft, max_ngram=max_ngram, min_ngram=min_ngram)
        if min_ngram > max_ngram:
            raise SamplingParamsError(f"min_ngram {min_ngram} is above max_ngram {max_ngram}")
        self.num_draft, self.max_ngram, self.min_ngram = num_draft, max_ngram, min_ngram

    def start(self, prompt: Sequence[int], capacity: int) -> None:
        """A new sequence: nothing to set up (the lookup reads the history each time)."""

    def draft(
        self, history: Sequence[int], k: int, filt: Filter, draw: Draw
    ) -> tuple[list[int], torch.Tensor | None]:
        """Up to k ids copied from the history, and None for q (a point mass on each)."""
        return find_continuation(history, k, self.max_ngram, self.min_ngram), None


class DraftModel:
    """Draft with a smaller model that shares the target's tokenizer.

    It keeps its own KV cache and the ids fed to it; each ``draft`` keeps the cached prefix that
    still agrees with the history (rolling back what the target rejected), feeds the rest, then
    draws k tokens one at a time from its filtered distribution q.

    Args:
        model: the draft Transformer.
        num_draft: most tokens drafted per step (k).
        vocab_size: the target's V: the draft's logits are cut or padded (with −inf) to it.

    Raises:
        SamplingParamsError: num_draft is not a positive int.
    """

    def __init__(self, model: Transformer, num_draft: int = 5, vocab_size: int | None = None):
        check_positive(num_draft=num_draft)
        self.model, self.num_draft = model, num_draft
        self.vocab_size = vocab_size or model.config.vocab_size
        self.cache: KVCache | None = None
        self.fed: list[int] = []  # the ids whose keys the cache holds, in order

    def start(self, prompt: Sequence[int], capacity: int) -> None:
        """A new sequence of at most ``capacity`` tokens: a fresh cache (capped at the draft's
        own context length; past it, it drafts nothing)."""
        size = min(capacity, self.model.config.context_length)
        self.cache, self.fed = self.model.new_cache(1, size), []

    @torch.inference_mode()
    def draft(
        self, history: Sequence[int], k: int, filt: Filter, draw: Draw
    ) -> tuple[list[int], torch.Tensor | None]:
        """Up to k drafted ids and their filtered logits q (k', V) float32."""
        assert self.cache is not None, "call start() first"
        # fed positions run to len(history) + k - 2: the last draft is never fed
        k = min(k, self.cache.max_seq_len - len(history) + 1)
        if k <= 0:
            return [], None
        keep = min(common_prefix(self.fed, history), len(history) - 1)  # re-run ≥ 1 token
        self.cache.truncate(keep)
        self.fed = list(history)
        logits = self.forward(history[keep:])
        ids, rows, seen = [], [], list(history)
        for i in range(k):
            q = filt(logits, seen)  # (V,)
            token = draw(q)
            ids.append(token)
            rows.append(q)
            seen.append(token)
            if i + 1 < k:
                logits = self.forward([token])
                self.fed.append(token)
        return ids, torch.stack(rows)  # (k, V)

    def forward(self, ids: Sequence[int]) -> torch.Tensor:
        """Feed ids at the cache's end; the last position's logits (V,), in the target's V."""
        tokens = torch.tensor([list(ids)], dtype=torch.long, device=self.model.device)  # (1, T)
        logits = self.model(tokens, cache=self.cache, last_only=True)[0, -1]  # (V_draft,)
        return fit_vocab(logits, self.vocab_size)


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits (..., V') → (..., vocab_size): cut, or padded with −inf (ids the draft cannot
    produce; same-tokenizer models may pad their embeddings to different sizes)."""
    extra = vocab_size - logits.shape[-1]
    if extra <= 0:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], extra), float("-inf"))
    return torch.cat([logits, pad], dim=-1)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids a and b share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def check_same_vocabulary(target: Tokenizer, draft: Tokenizer, draft_name: str = "") -> None:
    """Refuse a draft model whose tokenizer differs from the target's: its token ids would mean
    other text, and the target would reject nearly every draft.

    Raises:
        SamplingParamsError: the vocabularies differ (naming the first id that differs).
    """
    name = f" {draft_name}" if draft_name else ""
    if len(target.tokens) != len(draft.tokens):
        raise SamplingParamsError(
            f"the draft model{name} has another tokenizer ({len(draft.tokens)} tokens, the "
            f"target {len(target.tokens)}); speculative decoding needs the same vocabulary: "
            "use a draft of the target's family (e.g. Qwen2.5-Coder-0.5B for Qwen2.5-Coder-1.5B)"
        )
    for i, (a, b) in enumerate(zip(target.tokens, draft.tokens, strict=True)):
        if a != b:
            raise SamplingParamsError(
                f"the draft model{name} has another tokenizer (token {i} is {b!r}, the "
                f"target's {a!r}); speculative decoding needs the same vocabulary: use a draft "
                "of the target's family (e.g. Qwen2.5-Coder-0.5B for Qwen2.5-Coder-1.5B)"
            )


def check_positive(**sizes: object) -> None:
    """Raise SamplingParamsError unless every value is an int ≥ 1 (a bool is not one)."""
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SamplingParamsError(f"{key} must be an integer ≥ 1, got {value!r}")
