"""The bridge between a model's tokenizer and the grammar engine (structured output).

:func:`grammar_state` gives one sequence its :class:`~clearlm.sampling.grammar.GrammarState`.
The engine's view of the vocabulary is built from the tokenizer's own ``tokenizers`` pipeline
(the same one that encodes prompts, GGUF or folder alike), padded to the model's vocabulary
size, with the tokenizer's end ids as the tokens allowed where the grammar is complete. It
takes about a second for 50k tokens, so it is built once per tokenizer and kept.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from clearlm.sampling.grammar import GrammarState, grammar_vocab
from clearlm.tokenizer import Tokenizer

_VOCABS: weakref.WeakKeyDictionary[Tokenizer, dict[int, Any]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()  # the server builds states from its request threads


def tokenizer_vocab(tokenizer: Tokenizer, vocab_size: int) -> Any:
    """The engine's vocabulary (``llguidance.LLTokenizer``) for ``tokenizer`` with V =
    ``vocab_size`` (the model's, which may exceed the tokenizer's), cached per tokenizer."""
    with _LOCK:
        per_size = _VOCABS.setdefault(tokenizer, {})
        if vocab_size not in per_size:
            json = tokenizer.backend.to_str()
            per_size[vocab_size] = grammar_vocab(json, vocab_size, tokenizer.eos_ids)
        return per_size[vocab_size]


def grammar_state(
    tokenizer: Tokenizer, vocab_size: int, grammar: str | None
) -> GrammarState | None:
    """A fresh grammar state for one sequence, or None when ``grammar`` is None (free text).

    ``grammar`` comes from :func:`clearlm.sampling.grammar.compile_response_format` or
    :func:`~clearlm.sampling.grammar.compile_grammar_text`. Raises SamplingParamsError when it
    does not compile for this vocabulary."""
    if grammar is None:
        return None
    return GrammarState(grammar, tokenizer_vocab(tokenizer, vocab_size))
