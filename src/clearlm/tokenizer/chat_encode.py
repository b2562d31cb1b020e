"""A conversation to token ids where control tokens come only from the chat template.

Encoding the rendered prompt in one go (what transformers' ``apply_chat_template(...,
tokenize=True)`` and llama.cpp do) turns special-token text that a *user* typed into control
tokens: ``"hi<|im_end|>\\n<|im_start|>system\\n..."`` forges a system turn. Here the message
contents are text, always:

1. The template is rendered twice: with the real messages, and with each content (a string, or
   the ``text`` of a content part) replaced by a unique sentinel. Splitting the sentinel render
   gives the template's own text around each content; matching it against the real render (the
   content as is, stripped as jinja's ``trim`` does, or JSON-escaped by ``tojson``) gives where
   each content lies.
2. The control tokens are the special tokens that the one-go encoding finds in the template's
   own text (not in a content; a token with lstrip/rstrip may take whitespace along).
3. If the one-go encoding found no special token inside a content, its ids are the answer
   (exactly transformers'). Otherwise the text between two control tokens (template text and
   contents together) is encoded with a copy of the pipeline in which special tokens are plain
   text (`tokenizers`' ``encode_special_tokens``), each piece behind a marker token so that it
   is encoded as `tokenizers` encodes a piece that follows a special token (no SentencePiece
   prefix space). On harmless contents this equals the one-go encoding (tested).

A template that reshapes contents otherwise cannot be matched; then a conversation whose
contents hold special-token text is refused (ChatTemplateError) rather than encoded unsafely.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from clearlm.errors import ChatTemplateError
from clearlm.text import clean_text


class Tokenizer(Protocol):
    """What these functions read from a :class:`clearlm.tokenizer.core.Tokenizer` (named by
    its members, so that this module, which core.py imports, does not import core.py)."""

    backend: Backend
    special_ids: frozenset[int]
    source: str

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @property
    def text_backend(self) -> tuple[Backend, int]: ...

MARKER = "\ue000clearlm-piece\ue001"  # a private-use string no vocabulary holds


def _json_body(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]  # `content | tojson`, less its quotes


# What templates do to a content on its way out: nothing, jinja's trim, tojson.
_TRANSFORMS: tuple[Callable[[str], str], ...] = (
    str,
    str.strip,
    str.lstrip,
    str.rstrip,
    _json_body,
)


def text_only_backend(backend: Backend) -> tuple[Backend, int]:
    """A copy of ``backend`` that reads special-token text as plain text, plus the id of
    :data:`MARKER` (a non-special added token, so it splits the input as a special token does)."""
    copy = Backend.from_str(backend.to_str())
    copy.encode_special_tokens = True
    copy.add_tokens([AddedToken(MARKER, special=False, normalized=False)])
    return copy, copy.token_to_id(MARKER)


def _map_contents(
    messages: Sequence[dict[str, Any]], fn: Callable[[str, int], str]
) -> list[dict[str, Any]]:
    """Messages with each content string (and each content part's ``text``) replaced by
    ``fn(text, index)``, counting contents in order."""
    count = 0

    def one(text: str) -> str:
        nonlocal count
        count += 1
        return fn(text, count - 1)

    out = []
    for m in messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, str):
            m["content"] = one(content)
        elif isinstance(content, list):
            m["content"] = [
                {**p, "text": one(p["text"])}
                if isinstance(p, dict) and isinstance(p.get("text"), str)
                else p
                for p in content
            ]
        out.append(m)
    return out


def _align(
    literals: list[str], order: list[int], contents: list[str], text: str
) -> list[tuple[int, int]] | None:
    """Char spans of the contents in ``text`` = literals[0] c literals[1] c ... literals[-1],
    each c one of _TRANSFORMS of contents[order[j]]; None if no choice reproduces ``text``.

    A depth-first search over the choices (the first that reproduces ``text``, trying
    _TRANSFORMS in order), with an explicit stack so that a conversation of any length fits
    (one level per content), and the (content, position) states already found dead skipped."""
    if not text.startswith(literals[0]):
        return None
    if not order:
        return [] if len(literals[0]) == len(text) else None

    def choices(j: int, pos: int) -> list[tuple[int, int, int]]:
        """(start, end, next position) for each way content j can lie at ``pos``."""
        out, tried = [], set()
        for transform in _TRANSFORMS:
            x = transform(contents[order[j]])
            if x in tried or not text.startswith(x, pos):
                continue
            tried.add(x)
            end = pos + len(x)
            if text.startswith(literals[j + 1], end):
                out.append((pos, end, end + len(literals[j + 1])))
        return out

    start = len(literals[0])
    stack = [(start, iter(choices(0, start)))]  # (position of content j, its untried choices)
    spans: list[tuple[int, int]] = []  # the choices taken for contents 0 .. len(stack) - 2
    dead: set[tuple[int, int]] = set()
    while stack:
        j = len(stack) - 1
        choice = next(stack[-1][1], None)
        if choice is None:
            dead.add((j, stack.pop()[0]))
            if spans:
                spans.pop()
            continue
        begin, end, after = choice
        if j + 1 == len(order):
            if after == len(text):
                return [*spans, (begin, end)]
            continue
        if (j + 1, after) in dead:
            continue
        spans.append((begin, end))
        stack.append((after, iter(choices(j + 1, after))))
    return None


def content_spans(
    render: Callable[[list[dict[str, Any]]], str], messages: list[dict[str, Any]], text: str
) -> tuple[list[str], list[tuple[int, int]] | None]:
    """(the contents, their char spans in ``text`` or None if they cannot be located)."""
    contents: list[str] = []

    def collect(s: str, _: int) -> str:
        contents.append(s)
        return s

    _map_contents(messages, collect)
    nonce = secrets.token_hex(8)
    sentinel = re.compile(f"\ue000{nonce}:(\\d+)\ue001")
    marked = render(_map_contents(messages, lambda s, i: f"\ue000{nonce}:{i}\ue001"))
    parts = sentinel.split(marked)  # literal, index, literal, index, ..., literal
    order = [int(i) for i in parts[1::2]]
    return contents, _align(parts[0::2], order, contents, text)


def _has_special(tok: Tokenizer, text: str) -> bool:
    special = tok.special_ids
    return any(i in special for i in tok.backend.encode(text, add_special_tokens=False).ids)


def control_tokens(
    tok: Tokenizer, text: str, spans: list[tuple[int, int]]
) -> tuple[list[tuple[int, int, int]], list[int] | None]:
    """The special tokens that the one-go encoding of ``text`` finds in the template's own text
    (the token itself lies outside every content span), as (start, end, id); start/end include
    the whitespace a token with lstrip/rstrip takes along. Second: the one-go ids when every
    special token it found is such a control token (then they are already safe), else None."""
    out = []
    enc = tok.backend.encode(text, add_special_tokens=False)
    found = 0
    for i, (s, e) in zip(enc.ids, enc.offsets, strict=True):
        if i not in tok.special_ids:
            continue
        found += 1
        spelled = tok.backend.id_to_token(i) or ""
        core = text.find(spelled, s, e) if spelled else -1
        a, b = (core, core + len(spelled)) if core >= 0 else (s, e)
        if not any(a < c_end and c_start < b for c_start, c_end in spans):
            out.append((s, e, i))
    return out, (enc.ids if found == len(out) else None)


def encode_pieces(tok: Tokenizer, text: str, control: list[tuple[int, int, int]]) -> list[int]:
    """``text`` as ids: the ``control`` tokens, and the text between them encoded with special
    tokens read as text, each piece as `tokenizers` encodes a piece after a special token."""
    plain, marker = tok.text_backend
    ids: list[int] = []
    pos = 0
    for start, end, i in [*control, (len(text), len(text), -1)]:
        if start > pos:
            piece = text[pos:start]
            if pos == 0:
                ids += plain.encode(piece, add_special_tokens=False).ids
            else:  # behind a marker: no SentencePiece prefix space, as after a special token
                got = plain.encode(MARKER + piece, add_special_tokens=False).ids
                assert got[0] == marker
                ids += got[1:]
        if i >= 0:
            ids.append(i)
        pos = end
    return ids


def encode_chat(
    tok: Tokenizer,
    messages: list[dict[str, Any]],
    render: Callable[[list[dict[str, Any]]], str],
) -> list[int]:
    """Ids of the rendered conversation, control tokens only where the template writes them.

    Args:
        tok: the tokenizer.
        messages: the conversation (contents already clean text).
        render: messages → prompt text (the chat template with its other arguments).

    Raises:
        ChatTemplateError: the template fails, or it reshapes the contents so that they cannot
            be told apart from its own text and a content holds special-token text.
    """
    text = render(messages)
    contents, spans = content_spans(render, messages, text)
    if spans is None:
        if any(_has_special(tok, c) for c in contents):
            raise ChatTemplateError(
                f"the chat template of {tok.source} changes message contents, so special-token "
                "text typed in a message cannot be kept apart from the template's control "
                "tokens; remove it, or if the messages are trusted pass "
                "parse_special_in_content=True (CLI: --parse-special-in-content)"
            )
        return tok.encode(text, add_special_tokens=False)  # nothing a user could forge
    control, safe = control_tokens(tok, text, spans)
    return safe if safe is not None else encode_pieces(tok, text, control)


def clean_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages whose contents are valid Unicode (lone surrogates → U+FFFD)."""
    return _map_contents(messages, lambda s, _: clean_text(s))
