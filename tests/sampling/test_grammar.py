"""Structured output on the real default model (SmolLM2-135M-Instruct): every text parses as JSON
and validates against its schema (jsonschema, the reference validator), greedy and sampled,
alone and in a batch; the grammar step is in the sampling chain and in the explain view."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from clearlm.errors import SamplingError, SamplingParamsError
from clearlm.generation.grammar import grammar_state
from clearlm.inspect.sampling_explain import explain_sampling
from clearlm.sampling.chain import SamplingParams, filter_logits, sampling_chain
from clearlm.sampling.grammar import compile_grammar_text, compile_response_format

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "role", "active"],
    "additionalProperties": False,
}
SCORES = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 100},
    "minItems": 2,
    "maxItems": 4,
}
NESTED = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "streets": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20}},
                "required": ["name"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
    },
    "required": ["city", "streets"],
    "additionalProperties": False,
}
RANGED = {
    "type": "object",
    "properties": {
        "age": {"type": "integer", "minimum": 18, "maximum": 65},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["age", "score"],
    "additionalProperties": False,
}
SCHEMAS = {"person": PERSON, "scores": SCORES, "nested": NESTED, "ranged": RANGED}
PROMPT = "Answer in JSON. Describe a person who works at a library."


def json_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}


def check_valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


def test_schemas_greedy_and_sampled_all_validate(smollm2) -> None:
    """Four schemas x (greedy, two seeds), and one row without a grammar: one batch of thirteen
    rows, each its own grammar state; every JSON text parses, validates, and ends because its
    JSON closed; the free row is what it is alone (no grammar leaks into it)."""
    ids = smollm2.chat_prompt(PROMPT)
    names = [n for n in SCHEMAS for _ in range(3)]
    temps, seeds = [0.0, 0.8, 0.8] * len(SCHEMAS) + [0.0], [None, 1, 2] * len(SCHEMAS) + [None]
    formats = [json_format(SCHEMAS[n]) for n in names] + [None]
    results = smollm2.generate(
        [ids] * len(formats), max_new_tokens=[80] * len(names) + [16], temperature=temps,
        seed=seeds, response_format=formats,
    )  # fmt: skip
    for name, r in zip(names, results, strict=False):
        assert r.finish_reason == "stop", (name, r.text)  # the grammar closed the JSON
        check_valid(r.text, SCHEMAS[name])
    free = smollm2.generate(ids, max_new_tokens=16, temperature=0)
    assert results[-1].tokens == free.tokens
    with pytest.raises(json.JSONDecodeError):
        json.loads(free.text)  # the model alone does not answer in JSON here
    alone = smollm2.generate(ids, max_new_tokens=80, temperature=0, response_format=formats[0])
    assert alone.tokens == results[0].tokens  # a row of the batch = the request alone
    chunks = list(smollm2.stream(ids, 80, temperature=0, response_format=formats[0]))
    assert "".join(c.text for c in chunks) == alone.text
    assert chunks[-1].finish_reason == alone.finish_reason == "stop"


def test_chat_json_object_and_gbnf_grammar(smollm2) -> None:
    question = 'Reply with the JSON object {"ok": true} and nothing else.'
    r = smollm2.chat(question, max_new_tokens=40, temperature=0,  # greedy: a closed object
                     response_format={"type": "json_object"})
    assert r.finish_reason == "stop" and isinstance(json.loads(r.text), dict)
    grammar = compile_grammar_text('root ::= ("yes" | "no") "."')
    state = grammar_state(smollm2.tokenizer, smollm2.config.vocab_size, grammar)
    from clearlm.generation.loop import generate

    ids = smollm2.chat_prompt("Is the sky blue?")
    out = generate(smollm2.transformer, smollm2.tokenizer, ids, SamplingParams(0), 10,
                   grammar=state)  # fmt: skip
    assert out.text in ("yes.", "no.") and out.finish_reason == "stop"


@pytest.mark.parametrize(
    ("fmt", "words"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}},
         ["response_format.json_schema.schema", "foo"]),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}},
         ["response_format.json_schema.schema"]),
        ({"type": "xml"}, ["response_format.type"]),
        ({"type": "json_schema"}, ["response_format.json_schema"]),
        ("json", ["response_format"]),
    ],
)  # fmt: skip
def test_bad_response_format_is_one_line_error(fmt, words) -> None:
    with pytest.raises(SamplingParamsError) as e:
        compile_response_format(fmt)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_bad_grammar_text() -> None:
    with pytest.raises(SamplingParamsError, match="grammar is not a usable grammar: .*GBNF"):
        compile_grammar_text("root ::= (((")


def test_grammar_step_in_chain_and_explain(smollm2) -> None:
    """The mask is a chain step right after logit_bias: forbidden tokens get -inf, allowed ones
    keep their (biased) logits; the explain view lists it."""
    state = smollm2.grammar({"type": "json_object"})
    allowed = state.allowed()  # (V,) bool
    assert allowed.shape == (smollm2.config.vocab_size,) and 0 < int(allowed.sum()) < 1000
    open_brace = smollm2.tokenizer.encode("{", add_special_tokens=False)
    assert allowed[open_brace[0]]  # a JSON object starts with '{'
    logits = torch.randn(smollm2.config.vocab_size)
    params = SamplingParams(temperature=0.7, logit_bias={5: 3.0})
    names = [s.name for s in sampling_chain(params, None, None, allowed)]
    assert names[:3] == ["logit_bias", "grammar", "repetition_penalty"]
    out = filter_logits(logits, None, params, None, allowed)
    assert torch.isinf(out[~allowed]).all()
    kept = filter_logits(logits, None, SamplingParams(temperature=0), None, allowed)
    assert torch.equal(kept[allowed], logits[allowed])
    why = explain_sampling(logits, None, params, allowed=allowed)
    step = next(s for s in why.steps if s.name == "grammar")
    assert step.active and len(step.kept) == int(allowed.sum()) and allowed[why.token]


def test_end_token_only_where_the_grammar_accepts(smollm2) -> None:
    """An integer: the end ids are refused before any digit, allowed after "12" (which could
    also go on: not done), and the state refuses a token the grammar forbids."""
    state = smollm2.grammar(json_format({"type": "integer"}))
    eos = sorted(smollm2.tokenizer.eos_ids)
    assert not state.allowed()[eos].any()
    for t in smollm2.tokenizer.encode("12", add_special_tokens=False):
        state.advance(t)
    allowed = state.allowed()
    assert allowed[eos].all() and not state.is_done()
    letter = smollm2.tokenizer.encode("a", add_special_tokens=False)[0]
    assert not allowed[letter]
    with pytest.raises(SamplingError, match="breaks the grammar"):
        state.advance(letter)
