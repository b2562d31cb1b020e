"""Wrong-typed Python API arguments: a typed ClearLMError naming the argument, never a plain
Python error from deep inside, and never a silent wrong answer (bytes read as token ids,
bools read as ids 1 and 0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import (
    ClearLMError,
    ContextLengthError,
    ModelNotFoundError,
    PromptTypeError,
    SamplingError,
    SamplingParamsError,
)
from clearlm.sampling.chain import SamplingParams
from clearlm.sampling.numerics import check_logits

GREEDY = dict(max_new_tokens=4, temperature=0)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("api-args") / "tiny.gguf")


@pytest.fixture(scope="module")
def m(tiny_path):
    return clearlm.load(tiny_path)


def test_bytes_prompt_is_utf8_text_everywhere(m):
    """generate/stream/chat take bytes as UTF-8 text, as encode does (not as token ids)."""
    text = "hello wörld"
    assert m.encode(text.encode()) == m.encode(text)
    assert m.generate(text.encode(), **GREEDY).tokens == m.generate(text, **GREEDY).tokens
    streamed = [c.token for c in m.stream(text.encode(), **GREEDY)]
    assert streamed == [c.token for c in m.stream(text, **GREEDY)]
    assert m.chat(b"hi", **GREEDY).tokens == m.chat("hi", **GREEDY).tokens


@pytest.mark.parametrize(
    ("prompt", "needle"),
    [
        ({"a": 1}, "not a dict"),
        ({1, 2}, "not a set"),
        ([True, False], "holding bool"),
        ([1, 2.5], "holding float"),
        ([5, "a"], "item 1 is 'a' (str); generate() and stream() take a list of prompts"),
        ([1, 2, 3.5], "holding float: item 2 is 3.5 (float); token ids are ints"),
        (5, "not 5"),
        ([torch.tensor(1.0)], "holding Tensor"),
    ],
)
def test_bad_prompt_types(m, prompt, needle):
    for call in (m.encode, lambda p: m.generate(p, max_new_tokens=1), m.logits):
        with pytest.raises(PromptTypeError) as e:
            call(prompt)
        assert needle in str(e.value), str(e.value)


def test_an_empty_list_of_prompts_says_so(m):
    """generate([]) said "the prompt is empty": it is an empty list (of prompts or of ids)."""
    for call in (m.generate, m.stream):
        for empty in ([], ()):
            with pytest.raises(PromptTypeError) as e:
                call(empty, max_new_tokens=1)
            assert str(e.value) == (
                "the list of prompts is empty; give at least one prompt (text or token ids)"
            )
    with pytest.raises(ContextLengthError, match="the prompt is empty"):  # one prompt: no ids
        m.logits([])


@pytest.mark.parametrize(
    ("prompts", "item"),
    [
        (["a", 5], "item 1 is 5 (int)"),  # it named 'a', item 0, a valid prompt
        (["a", "b", None], "item 2 is None (NoneType)"),
        ([[1, 2], 2.5], "item 1 is 2.5 (float)"),
        ((b"a", {"x": 1}), "item 1 is {'x': 1} (dict)"),
    ],
)
def test_a_list_of_prompts_names_the_item_that_is_not_a_prompt(m, prompts, item):
    for call in (m.generate, m.stream):
        with pytest.raises(PromptTypeError) as e:
            call(prompts, max_new_tokens=1)
        assert str(e.value) == (
            f"{item} in the list of prompts, not a prompt; give each prompt as text (str) or "
            "a list of token ids"
        )


def test_a_batch_error_names_its_prompt(m):
    """A prompt of a batch that cannot run is named by its index, at the call."""
    for call in (m.generate, m.stream):
        with pytest.raises(ContextLengthError) as e:
            call([[104], [104] * 70], max_new_tokens=1)
        assert str(e.value) == (
            "prompt 1: the prompt has 70 tokens but the model's context length is 64; "
            "shorten the prompt"
        )
        with pytest.raises(ContextLengthError, match=r"^prompt 2: the prompt is empty"):
            call(["a", "b", []], max_new_tokens=1)


def test_integer_id_containers_accepted(m):
    ids = [104, 101, 108]
    assert m.encode(torch.tensor(ids)) == ids
    assert m.encode(np.array(ids, dtype=np.int64)) == ids
    assert m.encode(tuple(ids)) == ids


@pytest.mark.parametrize(
    "messages", [{"role": "user", "content": "hi"}, 5, [{"role": "user"}, "hi"], [["user", "hi"]]]
)
def test_bad_chat_messages(m, messages):
    with pytest.raises(PromptTypeError):
        m.chat(messages, max_new_tokens=1)


@pytest.mark.parametrize("stop", [123, [1], b"x", "", ["ok", ""], [None]])
def test_bad_stop(m, stop):
    for call in (m.generate, m.chat):
        with pytest.raises(SamplingParamsError, match="stop"):
            call("hi", stop=stop, max_new_tokens=1)


def test_params_as_dict(m):
    as_dict = m.generate("hi", max_new_tokens=4, params={"temperature": 0})
    as_obj = m.generate("hi", max_new_tokens=4, params=SamplingParams(temperature=0))
    assert as_dict.tokens == as_obj.tokens
    with pytest.raises(SamplingParamsError, match="bogus"):
        m.generate("hi", max_new_tokens=1, params={"bogus": 1})
    with pytest.raises(SamplingParamsError, match="params must be"):
        m.generate("hi", max_new_tokens=1, params=5)


def test_on_text_must_be_callable(m):
    with pytest.raises(ClearLMError, match="on_text must be a function"):
        m.generate("hi", max_new_tokens=1, on_text=5)


def test_hook_arguments(m):
    with pytest.raises(ClearLMError, match="dict"):
        with m.hooks(5):
            pass
    with pytest.raises(ClearLMError, match="dict"):
        with m.hooks(["embed"]):
            pass
    with pytest.raises(ClearLMError, match="name is a string"):
        m.add_hook(None, lambda x, n: x)
    with pytest.raises(ClearLMError, match="must be a function"):
        m.add_hook("embed", 5)
    with pytest.raises(ClearLMError, match="must be a function"):
        with m.hooks({"embed": 5}):
            pass
    assert not m.transformer.hooks.active  # nothing was left behind
    trace = m.run_with_trace("hi", names="embed")  # one name, not its letters
    assert set(trace) == {"embed"}


def test_load_argument_types(tiny_path):
    with pytest.raises(ModelNotFoundError, match="got int 5"):
        clearlm.load(5)
    assert clearlm.load(bytes(tiny_path)).config.vocab_size > 0


def test_nan_logits_message_names_half_only_for_half():
    bad = torch.tensor([[0.0, float("nan")]])
    with pytest.raises(SamplingError) as e32:
        check_logits(bad)
    assert "float16" not in str(e32.value) and "dtype" not in str(e32.value)
    with pytest.raises(SamplingError, match="float16 can overflow"):
        check_logits(bad.half())
    with pytest.raises(SamplingError, match="bfloat16 can overflow"):
        check_logits(bad.bfloat16())


def test_context_length_messages(m):
    """The tiny model's context is 64: a 64-token prompt can be scored but not continued, and
    a 65-token one is reported as 65 tokens against 64 (it said 65 against 65)."""
    ctx = m.config.context_length
    assert ctx == 64
    assert m.logits([104] * ctx).shape == (ctx, m.config.vocab_size)
    for call in (m.logits, m.next_token_distribution):
        with pytest.raises(ContextLengthError) as e:
            call([104] * (ctx + 1))
        assert str(e.value).startswith(
            "the prompt has 65 tokens but the model's context length is 64"
        )
    with pytest.raises(ContextLengthError, match="64 tokens and fills .* of 64: no room"):
        m.generate([104] * ctx, max_new_tokens=1)
