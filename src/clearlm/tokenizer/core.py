"""The Tokenizer: a `tokenizers` pipeline plus what the model adds (BOS/EOS, end-of-generation ids,
chat template), and the streaming detokenizer.

Built from a GGUF's metadata (:mod:`clearlm.tokenizer.gguf`) or from a Hugging Face folder's
tokenizer.json (:mod:`clearlm.tokenizer.hf`). Either way encode and decode are the `tokenizers`
pipeline's own, so they agree with transformers, which runs the same library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tokenizers import Tokenizer as Backend

from clearlm.errors import ChatTemplateError
from clearlm.text import clean_text
from clearlm.tokenizer.stream import DecodeRule, TextStream


@dataclass(eq=False)
class Tokenizer:
    """Text ↔ token ids for one model, plus its chat template.

    The readers build it: :func:`clearlm.tokenizer.tokenizer_from_gguf` (GGUF metadata) and
    :func:`clearlm.tokenizer.tokenizer_from_hf_folder` (a folder). ``eos_ids`` holds every
    id that ends generation (EOS, end of turn, end of message); ``special_ids`` are the special
    added tokens that ``skip_special_tokens`` drops. ``add_bos`` / ``add_eos`` say what
    ``encode(text)`` adds (the pipeline's post-processor adds them).

    Raises (on construction):
        UnsupportedModelError: the pipeline's decoder cannot be streamed exactly.
    """

    backend: Backend = field(repr=False)  # the `tokenizers` pipeline, post-processor included
    tokens: Sequence[str] = field(repr=False)  # id → token as the source spells it (TokenTable)
    special_ids: frozenset[int] = field(repr=False)
    bos_id: int | None
    eos_id: int | None
    eos_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    chat_template: str | None = field(repr=False)
    source: str
    # Named special tokens ('bos_token': '<s>', ...) as chat templates see them.
    special_tokens: Mapping[str, str] = field(default_factory=dict, repr=False)
    # Extra named templates ('tool_use', ...) besides the default one.
    chat_templates: Mapping[str, str] = field(default_factory=dict, repr=False)
    decode_rule: DecodeRule = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.decode_rule = DecodeRule.of(self.backend.decoder, self.source)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows (for a GGUF: the model's embedding rows)."""
        return len(self.tokens)

    def piece(self, i: int) -> str | None:
        """The token string the decoder sees for id ``i`` (None for an id the pipeline lacks: out
        of range, or a GGUF vocabulary's duplicate spelling). Asked of the pipeline each time
        (~0.2 µs) rather than kept as a second list of every token (~22 MiB for Gemma 3)."""
        return self.backend.id_to_token(i) if 0 <= i < self.vocab_size else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. Special-token text ('<|im_start|>') always maps to its one id;
        ``add_special_tokens`` only controls the BOS/EOS the model asks for (add_bos / add_eos).
        Lone surrogates become U+FFFD first (:func:`clearlm.text.clean_text`).

        Raises:
            ClearLMError: ``text`` is not a str.
        """
        return self.backend.encode(clean_text(text), add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD. ``skip_special_tokens`` drops special
        tokens ('<|im_end|>') but keeps other added tokens."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def text_backend(self) -> tuple[Backend, int]:
        """A copy of the pipeline that reads special-token text as text, and its marker id
        (see :mod:`clearlm.tokenizer.chat_encode`)."""
        from clearlm.tokenizer.chat_encode import text_only_backend

        return text_only_backend(self.backend)

    def id_to_token(self, i: int) -> str:
        """Token ``i`` as the source spells it (byte-level BPE: 'Ġhello' for ' hello')."""
        return self.tokens[i]

    def token_bytes(self, i: int) -> bytes:
        """The raw bytes token ``i`` stands for (b' hello'); a token may hold part of a character
        (byte-level BPE pieces, SentencePiece's '<0xE4>'). Not at the start of a text: there a
        SentencePiece decoder may drop the leading space."""
        piece = self.piece(i)
        return b"" if piece is None else self.decode_rule.piece_bytes(piece)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """Render ``messages`` ([{'role': 'user', 'content': '...'}, ...]) to prompt text.

        Rendered like transformers' ``apply_chat_template(..., tokenize=False)``: the same
        sandboxed jinja2 environment and template variables (messages, add_generation_prompt,
        tools, documents, the named special tokens such as bos_token and eos_token, and any
        ``variables``). ``tools`` are JSON schemas ({'type': 'function', 'function': {...}}).
        Encode the result with ``add_special_tokens=False`` if the template already writes BOS.

        Raises:
            ChatTemplateError: no template, or it failed to compile or render.
        """
        from clearlm.tokenizer.chat import pick_template, render_chat  # jinja2: only here

        template = pick_template(self.chat_template, self.chat_templates, tools, self.source)
        return render_chat(
            template,
            messages,
            add_generation_prompt,
            tools,
            documents,
            {**self.special_tokens, **variables},
            self.source,
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        parse_special_in_content: bool = False,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        **variables: Any,
    ) -> list[int]:
        """Token ids of the conversation rendered by :meth:`apply_chat_template` (no BOS is
        added: the template writes it).

        Message contents are text: special-token text typed in a message ('<|im_end|>') is
        encoded as ordinary pieces, and control tokens come only from the template (see
        :mod:`clearlm.tokenizer.chat_encode`). ``parse_special_in_content=True`` is the opt-in
        for trusted messages: the rendered text is encoded in one go, as transformers does.
        Lone surrogates in contents become U+FFFD.

        Raises:
            ChatTemplateError: no template, it failed or rendered nothing, or it reshapes
                contents that hold special-token text so that they cannot be kept apart from its
                control tokens.
        """
        from clearlm.tokenizer.chat_encode import clean_messages, encode_chat

        def render(msgs: list[dict[str, Any]]) -> str:
            return self.apply_chat_template(
                msgs, add_generation_prompt, tools, documents, **variables
            )

        messages = clean_messages(messages)
        if parse_special_in_content:
            ids = self.encode(render(messages), add_special_tokens=False)
        else:
            ids = encode_chat(self, messages, render)
        if not ids:
            raise ChatTemplateError(
                f"the chat template of {self.source} rendered nothing for this conversation "
                "(an empty template?); give the prompt as plain text instead (`clearlm generate`)"
            )
        return ids


class StreamingDetokenizer:
    """Turns ids into text one at a time, never yielding half a character.

    Each id's token goes through the tokenizer's decoder chain one stage at a time (see
    :mod:`clearlm.tokenizer.stream`): byte-level tokens through an incremental UTF-8 decoder
    (at most 3 bytes held), SentencePiece byte tokens ('<0xE4>') held until their run ends. So all
    outputs plus ``flush()`` equal ``tokenizer.decode(ids, skip_special_tokens)``, and each step
    costs O(length of the new token). (vLLM and HF's TextStreamer re-decode from a prefix offset
    and hold text ending in U+FFFD; following the decoder, the rule can be exact.)
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._text = TextStream(tokenizer.decode_rule)

    def add(self, token_id: int) -> str:
        """Feed one id; returns the text it completes (possibly '')."""
        if self.skip_special_tokens and token_id in self.tokenizer.special_ids:
            return ""
        piece = self.tokenizer.piece(token_id)
        return "" if piece is None else self._text.push(piece)  # decode skips unknown ids too

    def flush(self) -> str:
        """Emit what is held (U+FFFD for an incomplete character) and start afresh."""
        return self._text.flush()
