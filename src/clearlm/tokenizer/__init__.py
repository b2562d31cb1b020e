"""Tokenizer: text ↔ ids from GGUF metadata or a Hugging Face tokenizer.json (on `tokenizers`),
a streaming detokenizer and the chat template.

- :mod:`clearlm.tokenizer.core`: the :class:`Tokenizer` and :class:`StreamingDetokenizer`.
- :mod:`clearlm.tokenizer.gguf`: :func:`tokenizer_from_gguf`, the Tokenizer ``tokenizer.ggml.*``
  metadata describes; :mod:`clearlm.tokenizer.gguf_vocab`: its pipelines (byte-level BPE,
  SentencePiece-style BPE with merges derived from scores).
- :mod:`clearlm.tokenizer.hf`: :func:`tokenizer_from_hf_folder`, from tokenizer.json +
  tokenizer_config.json + generation_config.json.
- :mod:`clearlm.tokenizer.stream`: the decoder chain run one token at a time.
- :mod:`clearlm.tokenizer.chat`: chat templates in a jinja2 sandbox, as transformers renders them.

May import ``clearlm.text`` and ``clearlm.errors`` only (and ``tokenizers``, ``jinja2``).
"""

from clearlm.errors import ChatTemplateError
from clearlm.tokenizer.core import StreamingDetokenizer, Tokenizer
from clearlm.tokenizer.gguf import drop_vocab_arrays, tokenizer_from_gguf
from clearlm.tokenizer.gguf_vocab import CONTROL, NORMAL, PRE_TOKENIZERS, USER_DEFINED
from clearlm.tokenizer.hf import tokenizer_from_hf_folder
from clearlm.tokenizer.stream import bytes_to_unicode as _bytes_to_unicode

__all__ = [
    "CONTROL",
    "NORMAL",
    "PRE_TOKENIZERS",
    "USER_DEFINED",
    "ChatTemplateError",
    "StreamingDetokenizer",
    "Tokenizer",
    "_bytes_to_unicode",
    "drop_vocab_arrays",
    "tokenizer_from_gguf",
    "tokenizer_from_hf_folder",
]
