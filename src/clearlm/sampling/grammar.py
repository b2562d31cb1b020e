"""Structured output: a grammar that says, before each token, which tokens may come next.

The engine is llguidance (Microsoft's guidance project, the one llama.cpp, vLLM and SGLang can
use; Rust, no torch dependency): it compiles a JSON schema, a Lark grammar or a llama.cpp GBNF
grammar into a parser over the model's vocabulary, and for the current position returns a
bitmask of the tokens that keep the text a prefix of some sentence of the grammar (EOS only
where the text so far is a whole sentence).

Unlike the filters of :mod:`clearlm.sampling.filters` this holds state (the parser advances with
each accepted token), so it lives here as a small class, one per sequence, and meets the
sampling chain only through a boolean mask ``allowed`` ``(V,)`` that the chain's ``grammar``
step applies (:func:`clearlm.sampling.filters.grammar_mask`). Users of it, in order, per step:
``allowed = g.allowed()`` → sample with it → ``g.advance(token)`` → ``g.is_done()`` ends the
sequence (finish reason "stop") when the grammar can take no further token.

:func:`compile_response_format` turns OpenAI's ``response_format`` into a grammar (or None for
plain text); :func:`compile_grammar_text` a GBNF / Lark grammar. Both raise a one-line
:class:`~clearlm.errors.SamplingParamsError` naming the field and the engine's reason.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import llguidance

from clearlm.errors import GrammarError, SamplingError, SamplingParamsError

# Compact JSON: one space after ',' and ':', none elsewhere. llguidance's default allows any
# whitespace between tokens, which lets a small model pad forever with newlines.
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
SCHEMA_FIELD = "response_format.json_schema.schema"


def _checked(grammar: str, where: str) -> str:
    """The grammar, after the engine's own check; SamplingParamsError naming ``where``."""
    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message and not message.startswith("WARNING"):
        raise SamplingParamsError(f"{where} is not usable: {message.strip().splitlines()[0]}")
    return grammar


def json_schema_grammar(schema: Any, where: str = SCHEMA_FIELD) -> str:
    """The llguidance grammar of a JSON schema (a dict), or SamplingParamsError naming
    ``where`` and the engine's reason (an unknown type, a bad ``$ref``, ...)."""
    if not isinstance(schema, Mapping):
        raise SamplingParamsError(f"{where} must be a JSON object (a JSON schema), got {schema!r}")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults=JSON_OPTIONS
        )
    except (ValueError, TypeError) as e:
        raise SamplingParamsError(f"{where} is not a usable JSON schema: {e}") from None
    return _checked(grammar, where)


def compile_response_format(response_format: Any) -> str | None:
    """OpenAI's ``response_format`` → a grammar, or None for ``{"type": "text"}`` / None.

    ``{"type": "json_object"}``: any JSON object. ``{"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}, "strict": true}}``: JSON valid against ``schema`` (the
    output is always constrained, strict or not). Raises SamplingParamsError naming the field.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping) or "type" not in response_format:
        raise SamplingParamsError(
            'response_format must be an object like {"type": "json_object"}, '
            f"got {response_format!r}"[:200]
        )
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return json_schema_grammar({"type": "object"}, "response_format")
    if kind != "json_schema":
        raise SamplingParamsError(
            f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, Mapping) or "schema" not in spec:
        raise SamplingParamsError(
            'response_format.json_schema must be an object {"name": ..., "schema": {...}}'
        )
    return json_schema_grammar(spec["schema"])


def compile_grammar_text(text: str, where: str = "grammar") -> str:
    """A llama.cpp GBNF grammar (``root ::= ...``) or a Lark grammar (``start: ...``, the
    syntax of llguidance) → a grammar. Raises SamplingParamsError naming ``where``."""
    try:
        grammar = llguidance.grammar_from("grammar", text)
    except ValueError as e:
        raise SamplingParamsError(f"{where} is not a usable grammar: {e}") from None
    return _checked(grammar, where)


def grammar_vocab(backend_json: str, vocab_size: int, eos_ids: Collection[int]) -> Any:
    """The engine's view of a vocabulary (``llguidance.LLTokenizer``), from a ``tokenizers``
    pipeline serialized as JSON (``Tokenizer.backend.to_str()``), padded to the model's
    ``vocab_size`` V. About a second for 50k tokens: build it once per tokenizer
    (clearlm.tokenizer.grammar_vocab caches it)."""
    return llguidance.LLTokenizer(backend_json, n_vocab=vocab_size, eos_token=sorted(eos_ids))


def first_line(reason: str, default: str = "") -> str:
    """The first line of llguidance's error ``reason``, cut at 200 characters: never the parser
    state or the grammar text that follow it (on a server, the grammar is a client's request)."""
    return (reason.strip().splitlines() or [default])[0][:200]


def grammar_error(reason: str) -> GrammarError:
    """The one-line error for a grammar the engine gave up on (:func:`first_line` of its
    ``reason``)."""
    return GrammarError(
        f"the grammar cannot be followed: {first_line(reason, 'no reason given')}; simplify the "
        "grammar or schema (a rule or a required property that repeats itself forever has no "
        "end)"
    )


class GrammarState:
    """One sequence's position in a grammar.

    Args:
        grammar: a compiled grammar (:func:`compile_response_format`,
            :func:`compile_grammar_text`).
        vocab: :func:`grammar_vocab` of the model's tokenizer.

    Raises:
        SamplingParamsError: the grammar does not compile for this vocabulary.
        GrammarError: its first forced token already makes the engine give up (a grammar that
            forces endless text): checked here, on a copy, so that no step fails for it.
    """

    def __init__(self, grammar: str, vocab: Any) -> None:
        self.matcher = llguidance.LLMatcher(vocab, grammar, log_level=0)
        self.vocab_size: int = vocab.vocab_size
        self.last_allowed: Any = None  # the mask of the last allowed(): (V,) bool
        if self.matcher.is_error():
            raise SamplingParamsError(f"the grammar is not usable: {self.matcher.get_error()}")
        forced = self.matcher.compute_ff_tokens()  # tokens the grammar forces at the start
        if forced:  # ~10 ms for 6,000 forced tokens; nothing for a grammar that forces none
            probe = self.matcher.deep_copy()
            if not probe.consume_token(forced[0]):
                raise grammar_error(probe.get_error())

    def allowed(self) -> Any:
        """``(V,)`` bool tensor: True for the tokens the grammar accepts next (end ids only
        where the text so far is complete). Unpacks the engine's bitmask: ceil(V / 32) int32
        words, token i is bit i % 32 of word i // 32."""
        import torch  # here, so that the CLI can compile a grammar before torch's import

        words = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)
        bits = torch.arange(32, dtype=torch.int32)  # (32,)
        mask = (words[:, None] >> bits) & 1  # (W, 32): bit b of word w is token 32w + b
        self.last_allowed = mask.flatten()[: self.vocab_size].bool()  # (V,)
        return self.last_allowed

    def advance(self, token: int) -> None:
        """Move past an accepted token.

        Raises:
            SamplingError: the last :meth:`allowed` mask forbade the token (it was not applied:
                the caller's mistake).
            GrammarError: the engine gave up on the grammar at this token (too complex).
        """
        if not self.matcher.consume_token(token):
            forbidden = self.last_allowed is not None and not bool(self.last_allowed[token])
            if forbidden:
                reason = first_line(self.matcher.get_error())
                raise SamplingError(f"token {token} breaks the grammar: {reason}")
            raise grammar_error(self.matcher.get_error())

    def is_done(self) -> bool:
        """True when the grammar can take no further token: the output is complete."""
        return self.matcher.is_stopped()
