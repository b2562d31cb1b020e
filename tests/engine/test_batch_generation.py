"""model.generate([...]) / model.stream([...]): every row equals its prompt run alone with the
same settings (tokens, text, finish reason, logprobs), on tiny models of several families and
on SmolLM2, greedy and seeded sampling, float32 and float16, rows of different lengths that
finish at different steps."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_tiny import save_tiny
from test_family_gemma_phi3 import CASES as GEMMA_PHI3
from test_family_gpt2_opt_xglm import CASES as GPT2_OPT_XGLM
from test_tokenizer_hf import _save, _train
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import ClearLMError, ContextLengthError, PromptTypeError, SamplingParamsError

PROMPTS = ["hello world", "a b", "the quick brown fox jumps over", "x", "ab ab ab"]
# per row: max_new_tokens, temperature, seed, and extra settings
ROWS = [
    (12, 0.0, None, {}),
    (5, 0.9, 7, {"top_k": 20}),
    (20, 1.0, 11, {"top_p": 0.9, "repetition_penalty": 1.3}),
    (3, 0.7, 3, {"min_p": 0.05}),
    (9, 0.0, None, {"presence_penalty": 1.5, "frequency_penalty": 0.5}),  # OpenAI penalties
]


@pytest.fixture(scope="module", params=["llama-gguf", "gpt2", "gemma3"])
def path(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "llama-gguf":
        return write_tiny_llama(folder / "t.gguf")
    model_cls, config = {**GPT2_OPT_XGLM, **GEMMA_PHI3}[request.param]
    backend = _train("byte")  # a text tokenizer, so the folder loads with clearlm.load
    config = copy.deepcopy(config)
    config.vocab_size = backend.get_vocab_size()
    save_tiny(model_cls, config, folder)
    _save(backend, folder)
    return folder


def ids_prompts(model, n: int) -> list[list[int]]:
    """Token-id prompts of different lengths (the HF tiny folders have no text tokenizer)."""
    g = torch.Generator().manual_seed(5)
    return [torch.randint(3, model.config.vocab_size, (k,), generator=g).tolist() for k in n]


def alone_and_batched(model, prompts, greedy=False, **common):
    settings = [dict(max_new_tokens=n, temperature=t, seed=s, **x) for n, t, s, x in ROWS]
    if greedy:
        settings = [dict(max_new_tokens=n, temperature=0) for n, *_ in ROWS]
    alone = [model.generate(p, **common, **kw) for p, kw in zip(prompts, settings, strict=True)]
    batched = model.generate(
        prompts,
        **common,
        params=[{k: v for k, v in kw.items() if k != "max_new_tokens"} for kw in settings],
        max_new_tokens=[kw["max_new_tokens"] for kw in settings],
    )
    return alone, batched


def assert_rows_equal(alone, batched, logprob_tol=1e-4):
    assert len(alone) == len(batched)
    for a, b in zip(alone, batched, strict=True):
        assert b.tokens == a.tokens
        assert b.text == a.text and b.finish_reason == a.finish_reason
        assert b.prompt_tokens == a.prompt_tokens
        diffs = [abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)]
        assert max(diffs, default=0.0) < logprob_tol


def test_rows_equal_their_prompt_run_alone(path):
    """Greedy and seeded sampling (top-k, top-p, min-p, repetition penalty) rows, float32."""
    model = clearlm.load(path)
    prompts = ids_prompts(model, (6, 2, 11, 1, 7))
    alone, batched = alone_and_batched(model, prompts)
    assert [len(r.tokens) for r in batched] == [n for n, *_ in ROWS]  # finish at different steps
    assert_rows_equal(alone, batched)


def test_float16_rows_with_padding_slots_equal_alone(path):
    """float16: rows 3 and 1 finish first, so slot 1 is a padding row (position −1) of the
    decode batch while rows 0 and 2 go on; no NaN, and the greedy tokens equal each prompt
    run alone. (Sampled rows are not compared in float16: reading more masked keys changes
    attention by float16 rounding, which can flip a draw; float32 is exact to 1e-6.)"""
    model = clearlm.load(path, dtype="float16")
    prompts = ids_prompts(model, (6, 2, 11, 1, 7))
    alone, batched = alone_and_batched(model, prompts, greedy=True)
    assert all(torch.isfinite(torch.tensor(r.logprobs)).all() for r in batched)
    assert_rows_equal(alone, batched, logprob_tol=2e-2)


def test_stop_strings_end_ids_and_limits_per_row(tmp_path):
    """Row 0 stops at a stop string found in its own text, row 1 at its token limit, row 2
    runs into the context window, row 3 asks for no token at all (end ids: test_engine)."""
    model = clearlm.load(write_tiny_llama(tmp_path / "t.gguf"))
    free = model.generate(PROMPTS[0], max_new_tokens=12, temperature=0)
    stop = free.text[3:5]
    long_prompt = model.encode("abcdefghij" * 6)[:60]  # context 64: room for 4 tokens
    prompts = [PROMPTS[0], PROMPTS[1], long_prompt, PROMPTS[3]]
    stops = [[stop], None, None, None]
    caps = [12, 8, 10, 0]
    alone = [
        model.generate(p, max_new_tokens=n, stop=s, temperature=0)
        for p, n, s in zip(prompts, caps, stops, strict=True)
    ]
    batched = model.generate(prompts, max_new_tokens=caps, stop=stops, temperature=0)
    assert_rows_equal(alone, batched)
    assert batched[0].finish_reason == "stop" and len(batched[0].tokens) < 12
    assert [r.finish_reason for r in batched[2:]] == ["context_length", "length"]
    assert batched[3].tokens == [] and batched[3].text == ""


def test_stream_interleaves_rows_and_each_row_equals_stream_alone(tmp_path):
    model = clearlm.load(write_tiny_llama(tmp_path / "t.gguf"))
    chunks = list(model.stream(PROMPTS[:3], max_new_tokens=[4, 6, 2], temperature=0))
    assert [c.index for c in chunks[:3]] == [0, 1, 2]  # one token per row per step
    for i, n in enumerate([4, 6, 2]):
        alone = list(model.stream(PROMPTS[i], max_new_tokens=n, temperature=0))
        mine = [c for c in chunks if c.index == i]
        assert [(c.text, c.token, c.finish_reason) for c in mine] == [
            (c.text, c.token, c.finish_reason) for c in alone
        ]


def test_bad_batches_fail_before_generating(tmp_path):
    model = clearlm.load(write_tiny_llama(tmp_path / "t.gguf"))
    with pytest.raises(ContextLengthError, match="context length is 64"):
        model.generate(["hi", "x" * 70], max_new_tokens=2)
    with pytest.raises(ContextLengthError, match="context length is 64"):
        model.stream(["hi", "x" * 70], max_new_tokens=2)  # at the call, not at the first chunk
    with pytest.raises(SamplingParamsError, match="max_new_tokens: 3 values for 2 prompts"):
        model.generate(["a", "b"], max_new_tokens=[1, 2, 3])
    with pytest.raises(SamplingParamsError, match="seed: 1 values for 2 prompts"):
        model.generate(["a", "b"], seed=[1])
    with pytest.raises(SamplingParamsError, match="on_text"):
        model.generate(["a", "b"], on_text=print)


def test_a_bad_token_id_in_a_batch_names_its_prompt(tmp_path):
    """The error names the prompt (its index in the list) that holds the bad id or item, for
    generate and stream, and is the same class (and exit code) as for one prompt alone."""
    model = clearlm.load(write_tiny_llama(tmp_path / "t.gguf"))
    v = model.config.vocab_size
    with pytest.raises(ClearLMError) as alone:
        model.generate([5, v], max_new_tokens=2)
    want = f"token id {v} is outside the vocabulary [0, {v})"
    assert str(alone.value) == want
    for run in (model.generate, model.stream):
        with pytest.raises(ClearLMError) as caught:
            run([[5, 6], [1, 2, 3], [7, v, 8]], max_new_tokens=2)
        assert str(caught.value) == f"prompt 2: {want}" and type(caught.value) is ClearLMError
        with pytest.raises(ClearLMError, match=r"^prompt 1: token id -1 is outside"):
            run(["hello", [-1, 4]], max_new_tokens=2)
        with pytest.raises(PromptTypeError, match=r"^prompt 0: "):
            run([[5, "6"], [1]], max_new_tokens=2)


def test_smollm2_batch_equals_one_at_a_time(smollm2):
    prompts = [
        "The capital of France is",
        "Write a haiku about the sea:",
        "1, 2, 3,",
        "Hi",
        "Repeat after me: la la la",
    ]
    alone, batched = alone_and_batched(smollm2, prompts)
    assert_rows_equal(alone, batched)


@pytest.mark.parametrize("n_rows", [3, 6, 20])  # ≤ 16 rows: the compact kernel; more: dequantize
def test_compact_weights_rows_equal_alone(tmp_path, n_rows):
    """Compact (block-quantized) weights (the default load of a quantized GGUF), float32
    compute: the batched rows equal each prompt run alone, with the kernel's row count or
    beyond it."""
    from gguf import GGMLQuantizationType as Q

    path = write_tiny_llama(tmp_path / "q.gguf", matrix_type=Q.Q4_1, seed=4)
    model = clearlm.load(path)
    assert model.weights == "compact"
    prompts = (PROMPTS * 20)[:n_rows]
    settings = dict(max_new_tokens=10, temperature=0.8, top_k=30)
    alone = [model.generate(p, seed=i, **settings) for i, p in enumerate(prompts)]
    batched = model.generate(prompts, seed=list(range(n_rows)), **settings)
    assert_rows_equal(alone, batched)
