"""generation_config.json means what transformers makes of it (clearlm.sampling.defaults).

The reference is transformers itself: a tiny LlamaForCausalLM given
``GenerationConfig.from_pretrained(folder)`` resolves its effective settings with
``_prepare_generation_config`` (the file over transformers' global defaults) and builds its
logits processors with ``_get_logits_processor``. clearlm's resolved SamplingParams must give
the same mode (greedy or sampling) and the same filtered logits on random scores.
"""

from __future__ import annotations

import json

import pytest
import torch
from hf_tiny import TINY
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from clearlm.errors import InvalidModelFileError
from clearlm.loading.generation_config import read_generation_config
from clearlm.sampling.chain import SamplingParams, filter_logits
from clearlm.sampling.defaults import (
    CHAT_DEFAULTS,
    GENERATE_DEFAULTS,
    FileDefaults,
    chat_defaults,
    describe,
    resolve,
)

GEMMA3 = {"do_sample": True, "top_k": 64, "top_p": 0.95}  # the shape Gemma 3 ships
NO_DO_SAMPLE = {"temperature": 0.6, "top_p": 0.9}  # the issue's second file
CONFIGS = {
    "gemma3": GEMMA3,
    "no-do_sample": NO_DO_SAMPLE,
    "qwen-like": {
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    },
    "llama3-like": {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "bos_token_id": 1},
    "do_sample-only": {"do_sample": True},
    "greedy-with-penalty": {"do_sample": False, "repetition_penalty": 1.3, "top_k": 5},
    "min_p-top_k-null": {"do_sample": True, "min_p": 0.1, "top_k": None, "temperature": 1.3},
    "top_k-0": {"do_sample": True, "top_k": 0, "temperature": 1.5},
}


def write(folder, config: dict) -> None:
    (folder / "generation_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def hf_model() -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(**TINY)).eval()


def reference(hf_model, folder, **user):
    """transformers' effective GenerationConfig and logits processors for this folder."""
    hf_model.generation_config = GenerationConfig.from_pretrained(folder)
    effective, _ = hf_model._prepare_generation_config(None, **user)
    processors = hf_model._get_logits_processor(effective, input_ids_seq_length=4, device="cpu")
    return effective, processors


def params_for(folder, fallback: dict, **user) -> SamplingParams:
    values = {k: v for k, (v, _) in resolve(fallback, read_generation_config(folder), user).items()}
    return SamplingParams(**values)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_resolved_defaults_equal_transformers(name, tmp_path, hf_model) -> None:
    write(tmp_path, CONFIGS[name])
    effective, processors = reference(hf_model, tmp_path)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, TINY["vocab_size"], generator=g) * 3  # (B, V)
    history = torch.randint(0, TINY["vocab_size"], (4, 10), generator=g)  # (B, S)
    expected = processors(history, logits.clone())
    for fallback in (GENERATE_DEFAULTS, CHAT_DEFAULTS):  # the file decides for both
        params = params_for(tmp_path, fallback)
        assert params.is_greedy == (effective.do_sample is not True)
        ours = filter_logits(logits, history, params)
        assert torch.equal(torch.isinf(ours), torch.isinf(expected))
        torch.testing.assert_close(ours, expected, rtol=0, atol=0)
        if effective.do_sample is True:
            assert params.temperature == effective.temperature
            assert params.top_k == effective.top_k and params.top_p == effective.top_p
        assert params.repetition_penalty == effective.repetition_penalty


def test_the_issue_files(tmp_path) -> None:
    write(tmp_path, GEMMA3)
    p = params_for(tmp_path, GENERATE_DEFAULTS)
    assert (p.temperature, p.top_k, p.top_p) == (1.0, 64, 0.95)
    assert params_for(tmp_path, CHAT_DEFAULTS) == p  # chat samples too, as the file says
    write(tmp_path, NO_DO_SAMPLE)
    assert params_for(tmp_path, GENERATE_DEFAULTS).is_greedy
    assert params_for(tmp_path, CHAT_DEFAULTS).is_greedy


@pytest.mark.parametrize("name", ["gemma3", "no-do_sample", "greedy-with-penalty"])
def test_an_option_the_user_passes_wins(name, tmp_path, hf_model) -> None:
    write(tmp_path, CONFIGS[name])
    p = params_for(tmp_path, GENERATE_DEFAULTS, temperature=0.5, top_k=3, repetition_penalty=1.2)
    assert (p.temperature, p.top_k, p.repetition_penalty) == (0.5, 3, 1.2)
    # a temperature > 0 on a greedy file samples as transformers' do_sample=True would
    user = {"temperature": 0.5}
    effective, processors = reference(hf_model, tmp_path, do_sample=True, **user)
    p = params_for(tmp_path, CHAT_DEFAULTS, **user)
    logits = torch.randn(2, TINY["vocab_size"], generator=torch.Generator().manual_seed(1)) * 3
    history = torch.tensor([[1, 2, 3]] * 2)
    assert torch.equal(filter_logits(logits, history, p), processors(history, logits.clone()))
    assert p.top_k == effective.top_k and p.top_p == effective.top_p
    # and temperature 0 makes a sampling file greedy
    assert params_for(tmp_path, GENERATE_DEFAULTS, temperature=0).is_greedy


@pytest.mark.parametrize("config", [None, {"bos_token_id": 1, "eos_token_id": [2, 3]}])
def test_no_sampling_choice_keeps_clearlm_defaults(config, tmp_path) -> None:
    if config is not None:
        write(tmp_path, config)
    assert read_generation_config(tmp_path).values == {}
    assert params_for(tmp_path, GENERATE_DEFAULTS) == SamplingParams(temperature=0.8)
    # chat: ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1)
    ollama = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1)
    assert params_for(tmp_path, CHAT_DEFAULTS) == ollama
    assert chat_defaults(read_generation_config(tmp_path).values) == CHAT_DEFAULTS
    assert chat_defaults({}, {"top_k": 5}) == CHAT_DEFAULTS  # the caller's go over these
    assert chat_defaults({}, {"temperature": 0}) == {"temperature": 0.0}  # plain greedy


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_chat_defaults_are_the_files_values_when_it_sets_any(name, tmp_path) -> None:
    write(tmp_path, CONFIGS[name])
    file = read_generation_config(tmp_path)
    assert chat_defaults(file.values) == file.values  # all five settings, as transformers reads
    assert chat_defaults(file.values, {"temperature": 0}) == file.values  # its penalty stays
    want = {k: v for k, (v, _) in resolve(CHAT_DEFAULTS, file, {}).items()}
    assert SamplingParams(**chat_defaults(file.values)) == SamplingParams(**want)


def test_sources(tmp_path) -> None:
    write(tmp_path, GEMMA3)
    got = resolve(GENERATE_DEFAULTS, read_generation_config(tmp_path), {"seed": 3})
    assert got == {
        "temperature": (1.0, "transformers default"),
        "top_k": (64, "generation_config.json"),
        "top_p": (0.95, "generation_config.json"),
        "min_p": (0.0, "transformers default"),
        "repetition_penalty": (1.0, "transformers default"),
        "presence_penalty": (0.0, "clearlm default"),
        "frequency_penalty": (0.0, "clearlm default"),
        "seed": (3, "user"),
    }
    write(tmp_path, NO_DO_SAMPLE)
    rows = {r[0]: r[1:] for r in describe(read_generation_config(tmp_path))}
    assert rows["temperature"] == ("0", "0", "generation_config.json (do_sample absent: greedy)")
    assert rows["top_p"] == ("0.9", "0.9", "generation_config.json")
    write(tmp_path, {"do_sample": None, "top_p": 0.9})
    rows = {r[0]: r[1:] for r in describe(read_generation_config(tmp_path))}
    assert rows["temperature"] == ("0", "0", "generation_config.json (do_sample null: greedy)")
    rows = {r[0]: r[1:] for r in describe(FileDefaults())}
    assert rows["temperature"] == ("0.8", "0.8", "clearlm default")
    assert rows["top_k"] == ("0", "40", "clearlm default")
    assert rows["repetition_penalty"] == ("1", "1.1", "clearlm default")


def test_unsupported_settings_are_reported(tmp_path) -> None:
    write(tmp_path, {"do_sample": True, "typical_p": 0.9, "num_beams": 1, "epsilon_cutoff": 0.0})
    assert read_generation_config(tmp_path).ignored == ("typical_p=0.9",)
    write(tmp_path, {"do_sample": False, "typical_p": 0.9, "num_beams": 4})
    assert read_generation_config(tmp_path).ignored == ("num_beams=4",)  # typical_p: sampling


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"do_sample": True, "top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"do_sample": True, "temperature": -1}, "temperature must be in [0, inf)"),
        ({"top_k": -2}, "top_k must be an integer >= 0"),
        ([1, 2], "must hold a JSON object"),
        ({"do_sample": "yes", "temperature": 0.7}, "do_sample = 'yes' is invalid"),
        ({"do_sample": 1}, "do_sample = 1 is invalid"),
        ({"do_sample": "true"}, "do_sample = 'true' is invalid"),  # transformers: greedy
    ],
)
def test_invalid_values_name_the_file(config, needle, tmp_path) -> None:
    write(tmp_path, config)
    with pytest.raises(InvalidModelFileError) as info:
        read_generation_config(tmp_path)
    assert needle in str(info.value) and "generation_config.json" in str(info.value)
