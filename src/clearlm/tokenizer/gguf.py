"""The Tokenizer a GGUF's metadata describes: the vocabulary's pipeline
(:mod:`clearlm.tokenizer.gguf_vocab`), then control and user-defined tokens, the named special
tokens, BOS/EOS and every end-of-generation id, and the chat template.

We rebuild the `tokenizers` pipeline the model's own tokenizer.json has. Reference:
transformers' GGUF tokenizer (integrations/gguf/gguf_tokenizer_mapping.py), which tests compare
against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken, processors

from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.tokenizer.core import Tokenizer
from clearlm.tokenizer.end_ids import id_list
from clearlm.tokenizer.gguf_vocab import CONTROL, NORMAL, TOKENIZER_MODELS, USER_DEFINED, require
from clearlm.tokenizer.token_table import TokenTable

# Texts llama.cpp treats as end of generation whatever the metadata says (llama-vocab.cpp,
# "auto-detect special tokens by text"): Gemma's GGUF, for one, names no end-of-turn id.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
        "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
    }
)  # fmt: skip

# The per-token arrays a GGUF stores its vocabulary in (one Python object per token once read).
VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges")


def drop_vocab_arrays(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` with :data:`VOCAB_ARRAYS` removed (in place, and returned), for a model
    whose Tokenizer is already built from them: it keeps the vocabulary (``id_to_token``,
    ``vocab_size``), and the lists cost memory for as long as the model lives (Gemma 3's 262,144
    tokens, scores and types: 13 MiB of peak RSS, measured in a 512-token prefill)."""
    for key in VOCAB_ARRAYS:
        metadata.pop(key, None)
    return metadata


def _token_ids(metadata: Mapping[str, Any], name: str, vocab_size: int, source: str) -> list[int]:
    key = f"tokenizer.ggml.{name}_token_id"  # an int, or (eos/eot/eom) a list of end ids
    return id_list(metadata.get(key), f"{source}: {key}", vocab_size)


def bos_eos_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> Any:
    """The post-processor that puts BOS (text, id) in front and EOS at the end; None: neither."""
    single = [*([bos[0]] if bos else []), "$A", *([eos[0]] if eos else [])]
    special = [s for s in (bos, eos) if s is not None]
    return processors.TemplateProcessing(single=single, special_tokens=special)


def tokenizer_from_gguf(metadata: Mapping[str, Any], source: str = "GGUF file") -> Tokenizer:
    """Build the tokenizer a GGUF describes, from ``read_metadata(open_gguf(path))``.

    Args:
        metadata: the file's metadata as plain Python values.
        source: the file's name, for error messages.

    Raises:
        UnsupportedModelError: ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre`` is one
            clearlm does not implement (the message lists the supported ones).
        InvalidModelFileError: a required key is missing, or ids/merges are inconsistent.
    """
    kind = require(metadata, "tokenizer.ggml.model", source)
    if kind not in TOKENIZER_MODELS:
        raise UnsupportedModelError(
            f"{source} uses tokenizer model {kind!r}; supported: {', '.join(TOKENIZER_MODELS)}"
        )
    build, bos_default = TOKENIZER_MODELS[kind]
    tokens = require(metadata, "tokenizer.ggml.tokens", source)
    types = metadata.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise InvalidModelFileError(f"{source}: token_type and tokens differ in length")
    backend = build(tokens, types, metadata, source)
    all_ids = {name: _token_ids(metadata, name, len(tokens), source) for name in _NAMED_IDS}
    ids = {name: (found[0] if found else None) for name, found in all_ids.items()}
    # CONTROL → special (skippable when decoding); USER_DEFINED → plain added token. Both are
    # matched whole in the text before the model, as in llama.cpp and transformers, which adds
    # a USER_DEFINED token only if the vocabulary spells it the same (not Gemma's "  ").
    control = [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types, strict=True)
        if k == CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, k in zip(tokens, types, strict=True)
        if k == USER_DEFINED and (kind == "gpt2" or backend.token_to_id(t) is not None)
    ]
    backend.add_special_tokens(control)
    backend.add_tokens(user)
    # transformers registers the named tokens (bos, eos, unk, pad) as special too; one the
    # pipeline spells differently (so would get a new id) is left alone.
    named = {key: tokens[i] for n, key in _NAMED.items() if (i := ids[n]) is not None}
    added = {a.content for a in backend.get_added_tokens_decoder().values()}
    backend.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for n, key in _NAMED.items()
            if (t := named.get(key)) is not None
            and t not in added
            and backend.token_to_id(t) == ids[n]
        ]
    )
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", bos_default))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    bos, eos = ids["bos"], ids["eos"]
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise InvalidModelFileError(f"{source} asks to add BOS/EOS but gives no token id")
    backend.post_processor = bos_eos_processor(
        (tokens[bos], bos) if add_bos else None, (tokens[eos], eos) if add_eos else None
    )
    special = frozenset(i for i, a in backend.get_added_tokens_decoder().items() if a.special)
    ends = {i for n in ("eos", "eot", "eom") for i in all_ids[n]} | {
        i for i, t in enumerate(tokens) if t in EOG_TEXTS
    }
    return Tokenizer(
        backend=backend,
        tokens=TokenTable.of(tokens),
        special_ids=special,
        bos_id=bos,
        eos_id=eos,
        eos_ids=frozenset(ends),
        add_bos=add_bos,
        add_eos=add_eos,
        chat_template=metadata.get("tokenizer.chat_template"),
        source=source,
        special_tokens=named,
    )


# metadata name → transformers' name of the special token (a chat-template variable)
_NAMED = {"bos": "bos_token", "eos": "eos_token", "unknown": "unk_token", "padding": "pad_token"}
_NAMED_IDS = (*_NAMED, "eot", "eom")
