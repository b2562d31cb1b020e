"""The generation loop: stop conditions, streaming, seeds."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import SamplingParamsError
from clearlm.generation.loop import check_max_new_tokens
from clearlm.generation.text_stream import held_back as _held_back


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> clearlm.Model:
    return clearlm.load(
        write_tiny_llama(tmp_path_factory.mktemp("g") / "t.gguf", context_length=64)
    )


def test_max_new_tokens(tiny):
    res = tiny.generate("ab", max_new_tokens=5, temperature=0)
    assert len(res.tokens) <= 5
    if res.finish_reason != "eos":
        assert res.finish_reason == "length" and len(res.tokens) == 5


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3", None])
def test_max_new_tokens_is_checked_once_for_one_prompt_and_a_batch(tiny, bad):
    """One check (generation.check_max_new_tokens) serves generate_step and the batch: the same
    error for the same value, one prompt or many."""
    with pytest.raises(SamplingParamsError) as shared:
        check_max_new_tokens(bad)
    assert str(shared.value) == f"max_new_tokens must be an integer ≥ 0, got {bad!r}"
    for run in (lambda: tiny.generate("ab", max_new_tokens=bad),
                lambda: list(tiny.stream("ab", max_new_tokens=bad)),
                lambda: tiny.generate(["ab", "cd"], max_new_tokens=bad),
                lambda: tiny.generate(["ab", "cd"], max_new_tokens=[2, bad])):  # fmt: skip
        with pytest.raises(SamplingParamsError) as e:
            run()
        assert str(e.value) == str(shared.value)
    for good in (0, 3):
        check_max_new_tokens(good)  # no error


def test_stop_string_spanning_tokens_is_cut_and_not_printed(tiny):
    """Every byte is one token in the tiny vocabulary, so a 3-character stop spans 3 tokens."""
    full = tiny.generate("hello", max_new_tokens=30, temperature=0, seed=0)
    text = full.text
    if len(text) < 8:
        pytest.skip("tiny model ended too early for this check")
    stop = text[4:7]
    cut = text.find(stop)  # the first occurrence decides
    shown: list[str] = []
    res = tiny.generate(
        "hello", max_new_tokens=30, temperature=0, stop=[stop], on_text=shown.append
    )
    assert res.finish_reason == "stop"
    assert res.text == text[:cut]
    assert "".join(shown) == text[:cut]
    assert stop not in "".join(shown)


def test_stream_chunks_add_up_to_generate(tiny):
    chunks = list(tiny.stream("abc", max_new_tokens=12, temperature=0))
    assert chunks[-1].finish_reason in ("length", "eos")
    assert all(c.finish_reason is None for c in chunks[:-1])
    res = tiny.generate("abc", max_new_tokens=12, temperature=0)
    assert "".join(c.text for c in chunks) == res.text


def test_eos_stops_generation(tiny, monkeypatch):
    """An output projection that always favours EOS: the run ends at once with reason eos."""
    import torch

    eos = tiny.tokenizer.eos_id
    head = tiny.transformer.lm_head

    class EOSHead(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            logits = head(x)
            logits[..., eos] = logits.max() + 10.0
            return logits

    # setitem, not setattr: undoing a setattr would delete the submodule for later tests
    monkeypatch.setitem(tiny.transformer._modules, "lm_head", EOSHead())
    res = tiny.generate("abc", max_new_tokens=10, temperature=0)
    assert res.finish_reason == "eos"
    assert res.tokens == [eos]
    assert res.text == ""


def test_held_back_prefixes():
    assert _held_back("Hello wor", ["world"]) == 3
    assert _held_back("Hello", ["xyz"]) == 0
    assert _held_back("ab", ["abc", "b!"]) == 2


def test_same_seed_same_text_twice(smollm2):
    kw = dict(max_new_tokens=24, temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    a = smollm2.generate("Once upon a time", **kw)
    b = smollm2.generate("Once upon a time", **kw)
    c = smollm2.generate("Once upon a time", **{**kw, "seed": 4321})
    assert a.tokens == b.tokens and a.text == b.text
    assert a.tokens != c.tokens  # a different seed draws differently (checked for these seeds)


def test_chat_uses_template_and_answers(smollm2):
    ids = smollm2.chat_prompt("What is the capital of France?")
    text = smollm2.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    res = smollm2.chat("What is the capital of France?", max_new_tokens=24, temperature=0)
    assert "Paris" in res.text


def test_next_token_distribution(smollm2):
    probs = smollm2.next_token_distribution("The capital of France is")
    assert probs.shape == (smollm2.config.vocab_size,)
    assert abs(probs.sum().item() - 1) < 1e-5
    top = smollm2.tokenizer.decode([int(probs.argmax())])
    assert top.strip() == "Paris"


def test_tiny_path_roundtrip(tmp_path: Path):
    p = write_tiny_llama(tmp_path / "x.gguf")
    assert clearlm.load(p).config.n_layers == 2


def test_result_prints_as_its_text_and_batches_go_to_generate(tiny):
    res = tiny.generate("hello", max_new_tokens=4, temperature=0)
    assert str(res) == res.text and f"{res}" == res.text
    with pytest.raises(clearlm.PromptTypeError, match="generate.. and stream.. take a list"):
        tiny.encode(["a", "b"])
    with pytest.raises(clearlm.PromptTypeError):
        tiny.generate(["a", 5], max_new_tokens=2)  # neither a prompt nor a list of prompts
    assert [r.tokens for r in tiny.generate(["hello"], max_new_tokens=4, temperature=0)] == [
        res.tokens
    ]
    ids = tiny.encode("hello")
    assert tiny.generate(ids, max_new_tokens=4, temperature=0).tokens == res.tokens
