"""lm-evaluation-harness (``lm-eval``, its ``local-completions`` model) against ``clearlm serve``
on SmolLM2: a 4-item multiple-choice task (loglikelihood: ``echo`` + ``logprobs`` on token ids)
and a 2-item generate_until task, both defined in tests/serve/data/lm_eval/ and read from local
JSONL files (``HF_DATASETS_OFFLINE=1``: nothing is downloaded). lm-eval tokenizes with clearlm's
own tokenizer (its `tokenizers` pipeline, saved as a transformers tokenizer folder) and sends ids;
every log-likelihood it computes equals clearlm's own log-softmax of the model's logits, and every
generation equals clearlm's greedy ``generate`` on the same ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from serve_helpers import serving

import clearlm
from clearlm.serve import create_app

TASKS = Path(__file__).parent / "data" / "lm_eval"
MODEL = "smollm2-135m-instruct"

lm_eval = pytest.importorskip("lm_eval")


def hf_tokenizer_folder(model: clearlm.Model, folder: Path) -> Path:
    """clearlm's tokenizer as a transformers tokenizer folder (what lm-eval loads)."""
    from transformers import PreTrainedTokenizerFast

    eos = model.tokenizer.decode([model.tokenizer.eos_id])
    hf = PreTrainedTokenizerFast(tokenizer_object=model.tokenizer.backend, eos_token=eos)
    hf.save_pretrained(folder)
    return folder


def own_loglikelihood(model: clearlm.Model, context: str, continuation: str) -> float:
    """log P(continuation | context), tokenized as lm-eval does (the whole text's ids after the
    context's own), from the log-softmax of one forward pass (float64)."""
    ctx = model.encode(context)
    ids = model.encode(context + continuation)
    assert ids[: len(ctx)] == ctx  # the split lm-eval makes is a clean one here
    lp = torch.log_softmax(model.logits(ids).double(), dim=-1)  # (T, V): row t scores t + 1
    return sum(float(lp[t - 1, ids[t]]) for t in range(len(ctx), len(ids)))


@pytest.fixture(scope="module")
def evaluated(smollm2, tmp_path_factory, monkeypatch_module):
    tmp = tmp_path_factory.mktemp("lm_eval")
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch_module.setenv(key, "1")
    monkeypatch_module.setenv("HF_DATASETS_CACHE", str(tmp / "datasets"))
    monkeypatch_module.chdir(TASKS)  # the tasks name their data files relative to here
    tokenizer = hf_tokenizer_folder(smollm2, tmp / "tokenizer")
    from lm_eval.tasks import TaskManager

    with serving(create_app(smollm2, model_id=MODEL)) as url:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"base_url={url}/completions,model={MODEL},tokenizer_backend=huggingface,"
            f"tokenizer={tokenizer},max_retries=1,timeout=60",
            tasks=["clearlm_tiny_mc", "clearlm_tiny_gen"],
            # only the two tasks here: indexing lm-eval's 14,000 built-in tasks took ~20 s
            task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
            log_samples=True,
        )
    return results


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_loglikelihoods_equal_clearlms_own(evaluated, smollm2):
    samples = evaluated["samples"]["clearlm_tiny_mc"]
    assert len(samples) == 4
    for s in samples:
        assert len(s["arguments"]) == len(s["doc"]["choices"]) == 3
        for (context, continuation), resp in zip(s["arguments"], s["resps"], strict=True):
            got, _is_greedy = resp[0]
            want = own_loglikelihood(smollm2, context, continuation)
            assert got == pytest.approx(want, abs=1e-4), (context, continuation)
    acc = evaluated["results"]["clearlm_tiny_mc"]["acc,none"]
    assert 0.0 <= acc <= 1.0


def test_generate_until_equals_clearlms_greedy(evaluated, smollm2):
    samples = evaluated["samples"]["clearlm_tiny_gen"]
    assert len(samples) == 2
    eos = smollm2.tokenizer.decode([smollm2.tokenizer.eos_id])
    for s in samples:
        (context, gen_kwargs) = s["arguments"][0]
        (text,) = s["resps"][0]
        want = smollm2.generate(smollm2.encode(context), max_new_tokens=8, stop=["\n", eos],
                                temperature=0).text  # fmt: skip
        assert text == want and text.strip(), (context, text)
