"""GGUF vocabularies → `tokenizers` pipelines: byte-level BPE ("gpt2") and SentencePiece-style
BPE ("llama", merges derived from scores), with the pre-tokenizer ``tokenizer.ggml.pre`` names.

A GGUF has no ``tokenizer.json``: it stores vocabulary, merges or scores and token types as
``tokenizer.ggml.*`` metadata and only names the pre-tokenizer, whose regexes live in llama.cpp
(src/llama-vocab.cpp). :mod:`clearlm.tokenizer.gguf` adds the special tokens and ids on top.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import itemgetter, methodcaller
from typing import Any

import numpy as np
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend

from clearlm.errors import InvalidModelFileError, UnsupportedModelError
from clearlm.tokenizer.stream import BYTE_TO_CHAR, CHAR_TO_BYTE

_ALPHABET = frozenset(CHAR_TO_BYTE)  # the byte-level alphabet: one C-level check per token

# llama.cpp's token types (llama.h, enum llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# tokenizer.ggml.pre → pre-tokenizer. Regexes are the originals from each model's tokenizer.json,
# as quoted in llama-vocab.cpp (llama.cpp runs hand-expanded rewrites of the same patterns).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level() -> pre_tokenizers.PreTokenizer:
    """GPT-2: its own regex, then bytes → byte alphabet."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _split_then_bytes(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    # llama.cpp's "default" adds punctuation and digit pre-splits; transformers (our reference)
    # uses GPT-2's. "gpt-2" is llama.cpp's label for GPT-2 and its kin (phi-2, roberta-bpe).
    "default": _byte_level,
    "gpt-2": _byte_level,
    "gpt2": _byte_level,
    # SmolLM's tokenizer.json and llama.cpp: every digit alone first, then GPT-2's regex.
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), _byte_level()]
    ),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}


def require(metadata: Mapping[str, Any], key: str, source: str) -> Any:
    if key not in metadata:
        raise InvalidModelFileError(f"{source} has no tokenizer metadata key {key!r}")
    return metadata[key]


def byte_level_bpe(
    tokens: list[str], types: list[int], metadata: Mapping[str, Any], source: str
) -> Backend:
    """A ``gpt2`` vocabulary: byte-level BPE (what transformers' GPT2Tokenizer builds), with the
    pre-tokenizer ``tokenizer.ggml.pre`` names and a ByteLevel decoder.

    A NORMAL token the file spells outside the byte alphabet is respelled byte by byte, as
    transformers does; CONTROL / USER_DEFINED tokens keep their text, so registering them as
    added tokens finds their id instead of growing the vocabulary (llama.cpp matches them whole;
    transformers skips a CONTROL token outside the byte alphabet, such as DeepSeek's
    '<｜end▁of▁sentence｜>').
    """
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{source} uses pre-tokenizer {pre!r}; supported: {', '.join(PRE_TOKENIZERS)}"
        )
    vocab = _byte_level_vocab(tokens, types)
    merges = require(metadata, "tokenizer.ggml.merges", source)
    pairs = [(a, b) for a, _, b in map(methodcaller("partition", " "), merges)]
    # llama.cpp sets tokenizer_ignore_merges for Llama 3 (a word already in the vocabulary is
    # taken whole), as does Llama 3's tokenizer.json ("ignore_merges": true).
    try:
        backend = Backend(models.BPE(vocab, pairs, ignore_merges=pre == "llama-bpe"))
    except Exception:  # tokenizers refuses a merge whose parts or result it lacks: name it
        for merge, (a, b) in zip(merges, pairs, strict=True):
            if a not in vocab or b not in vocab or a + b not in vocab:
                raise InvalidModelFileError(
                    f"{source}: BPE merge {merge!r} leaves the vocabulary"
                ) from None
        raise
    backend.pre_tokenizer = PRE_TOKENIZERS[pre]()
    backend.decoder = decoders.ByteLevel()
    return backend


def _byte_level_vocab(tokens: list[str], types: list[int]) -> dict[str, int]:
    """token → id (a duplicate spelling keeps its first id), NORMAL tokens outside the byte
    alphabet respelled byte by byte (see byte_level_bpe). Usually no token needs it: one check
    of the joined text and one dict build (Qwen2.5's 151,936 tokens: 40 ms, a loop 110 ms)."""
    if _ALPHABET.issuperset("".join(tokens)):
        return dict(zip(reversed(tokens), range(len(tokens) - 1, -1, -1), strict=True))
    vocab: dict[str, int] = {}
    for i, (token, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind not in (CONTROL, USER_DEFINED) and not _ALPHABET.issuperset(token):
            token = "".join(BYTE_TO_CHAR[b] for b in token.encode("utf-8"))
        vocab.setdefault(token, i)
    return vocab


def merges_from_scores(
    vocab: Mapping[str, int], score: Mapping[str, float]
) -> list[tuple[str, str]]:
    """BPE merges for a vocabulary that lists none (SentencePiece BPE keeps only scores).

    Every way to cut a token into two tokens of the vocabulary is a merge; merges rank by the
    score of the token they make (best first), then longer left part, then longer right part.
    SentencePiece's BPE merges the adjacent pair whose result scores best, so ranking merges by
    the merged token's score lets `tokenizers`' rank-ordered BPE follow it (two cuts of one token
    tie in SentencePiece, which then takes the leftmost; here the longer left part wins). Same
    rule and tie order as transformers' tokenization_utils_base.generate_merges with scores.

    Args:
        vocab: token → id.
        score: token → score, in the order ties are kept (higher merges first).

    Cost: every cut of every token is looked up (1.2 M for Gemma 3's 262,144 tokens), one cut
    length at a time over all longer tokens with C-level ``map``s, then one numpy sort; 1.2 s
    of CPU time for Gemma 3 before, ~0.6 s now (same list: tests/tokenizer/test_tokenizer_sp.py).
    """
    toks = list(score)  # the tie order
    s = np.fromiter(score.values(), dtype=np.float64, count=len(toks))
    lens = np.fromiter(map(len, toks), dtype=np.int64, count=len(toks))
    by_len = np.argsort(-lens, kind="stable")  # longest first: the tokens longer than k lead
    longest_first = [toks[i] for i in by_len.tolist()]
    neg_len = -lens[by_len]  # ascending
    has = vocab.__contains__
    where, cut = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]  # token index, len(left)
    for k in range(1, int(lens.max(initial=0))):
        cand = longest_first[: int(np.searchsorted(neg_len, -k))]  # len > k
        left = np.flatnonzero(np.fromiter(map(has, map(itemgetter(slice(k)), cand)), bool))
        rights = map(has, map(itemgetter(slice(k, None)), [cand[i] for i in left.tolist()]))
        hits = by_len[left[np.fromiter(rights, bool, count=len(left))]]
        where.append(hits)
        cut.append(np.full(len(hits), k, np.int64))
    pos, k_a = np.concatenate(where), np.concatenate(cut)
    # best score first, then longer left part, then longer right part, then token order
    order = np.lexsort((pos, k_a - lens[pos], -k_a, -s[pos]))
    return [(toks[p][:k], toks[p][k:]) for p, k in zip(pos[order].tolist(),
                                                         k_a[order].tolist(), strict=True)]


# SentencePiece pipelines per architecture, as transformers builds them: GemmaTokenizer for
# Gemma (no prefix space; spaces → '▁' by a normalizer; the whole text is one BPE word),
# LlamaTokenizer for the rest (Metaspace adds '▁' in front of the text), Phi-3's own normalizer.
_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")


def sentencepiece_bpe(
    tokens: list[str], types: list[int], metadata: Mapping[str, Any], source: str
) -> Backend:
    """A ``llama`` vocabulary (tokens + scores, no merges): BPE with byte fallback.

    Gemma: the file spells tokens of two or more spaces with real spaces, while the pipeline
    looks for '▁'; they are respelled, and merges rank by position in the file, which for Gemma
    is the merge order (its scores are not). Others rank by ``tokenizer.ggml.scores``.
    ``tokenizer.ggml.add_space_prefix`` (default true, as in llama.cpp) decides whether '▁' is
    put in front of the text (transformers always does).
    """
    arch = metadata.get("general.architecture", "llama")
    if arch in _GEMMA_ARCHS:
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        score = {t: -float(i) for i, t in enumerate(tokens)}
    else:
        scores = require(metadata, "tokenizer.ggml.scores", source)
        if len(scores) != len(tokens):
            raise InvalidModelFileError(f"{source}: scores and tokens differ in length")
        score = dict(zip(tokens, map(float, scores), strict=True))
    vocab = {t: i for i, t in enumerate(tokens)}  # a duplicate keeps its last id (transformers)
    merges = merges_from_scores(vocab, score)
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    backend = Backend(
        models.BPE(
            vocab,
            merges,
            unk_token=tokens[unk] if unk is not None and arch in _GEMMA_ARCHS else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # '▁' → space, '<0xE4>' tokens → bytes, join; LlamaTokenizer also strips the added space.
    decode = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if arch in _GEMMA_ARCHS:
        backend.normalizer = normalizers.Replace(" ", "▁")
        # a no-op after the normalizer (no spaces are left), kept as GemmaTokenizer has it
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        backend.decoder = decoders.Sequence(decode)
        return backend
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    if arch == "phi3":  # a normalizer puts '▁' in front of every piece between added tokens
        steps = [normalizers.Prepend("▁")] if prefix else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first" if prefix else "never", split=False
        )
    strip = [decoders.Strip(" ", 1, 0)] if prefix else []
    backend.decoder = decoders.Sequence([*decode, *strip])
    return backend


# tokenizer.ggml.model → (backend builder, BOS default when tokenizer.ggml.add_bos_token is
# absent: llama.cpp adds BOS for SentencePiece vocabularies that do not say otherwise).
TOKENIZER_MODELS: dict[str, tuple[Callable[..., Backend], bool]] = {
    "gpt2": (byte_level_bpe, False),
    "llama": (sentencepiece_bpe, True),
}
