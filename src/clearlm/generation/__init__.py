"""Generation: the autoregressive loop (prefill once, then one decode step per new token).

``loop.py`` is the loop itself (prefill, decode_step, generate), ``stops.py`` checks stop
strings and callbacks, ``text_stream.py`` turns the growing list of token ids into text pieces
as they become whole characters, ``perplexity.py`` scores a text with the same forward
passes, ``grammar.py`` gives a tokenizer's vocabulary to the grammar engine of structured
output (clearlm.sampling.grammar), and ``speculative.py`` (with its drafters in
``drafters.py``) checks several drafted tokens per forward pass.

May import the readable path below it: ``clearlm.model`` (the Transformer and its KV cache),
``clearlm.sampling``, ``clearlm.tokenizer``, ``clearlm.errors``, ``clearlm.config``,
``clearlm.text``. Batching of many sequences lives in ``clearlm.engine``, speed in
``clearlm.runtime``. ``Chunk``, ``GenerationResult`` and ``generate`` are read from loop.py on
first use (PEP 562), so that ``stops.py`` can be imported without torch.
"""

import importlib

_NAMES = {"Chunk", "GenerationResult", "generate"}


def __getattr__(name: str):
    """``clearlm.generation.GenerationResult`` and friends, from loop.py on first use.

    Raises:
        AttributeError: no such name.
    """
    if name in _NAMES:
        return getattr(importlib.import_module("clearlm.generation.loop"), name)
    raise AttributeError(f"module 'clearlm.generation' has no attribute {name!r}", name=name)


__all__ = sorted(_NAMES)
