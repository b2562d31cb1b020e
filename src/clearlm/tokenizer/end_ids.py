"""The ids that end generation, read from any model file: an int or a list of ints.

Every source adds to one set (transformers reads ``eos_token_id`` as an int or a list; Llama 3
lists three end ids): config.json and generation_config.json's ``eos_token_id``, the named
``eos_token`` of tokenizer_config.json, and a GGUF's ``tokenizer.ggml.eos_token_id``,
``eot_token_id`` and ``eom_token_id`` (llama.cpp's LLM_KV_TOKENIZER_EOS_ID / EOT_ID / EOM_ID).
"""

from __future__ import annotations

from typing import Any

from clearlm.errors import InvalidModelFileError


def id_list(value: Any, where: str, vocab_size: int | None = None) -> list[int]:
    """``value`` (None, an int or a list of ints) as a list, in its order.

    Args:
        value: the metadata or JSON value.
        where: the file and key, for the error message ("config.json: eos_token_id").
        vocab_size: when given, every id must lie in [0, vocab_size).

    Raises:
        InvalidModelFileError: not an int or a list of ints, or an id outside the vocabulary.
    """
    if value is None:
        return []
    ids = [value] if isinstance(value, int) else value
    if not isinstance(ids, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise InvalidModelFileError(f"{where} {value!r} is not an int or a list of ints")
    bad = [i for i in ids if vocab_size is not None and not 0 <= i < vocab_size]
    if bad:
        raise InvalidModelFileError(f"{where} {bad[0]} is outside the vocabulary")
    return [int(i) for i in ids]
