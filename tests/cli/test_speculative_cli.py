"""Speculative decoding through the front doors: the real SmolLM2 (greedy equals plain, with
prompt lookup), the CLI options and their refusals, and the server's engine."""

from __future__ import annotations

import json
import subprocess

import pytest
from cli_in_process import run_clearlm
from serve_helpers import serving
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.engine import Request
from clearlm.engine.serial import SerialEngine
from clearlm.engine.speculative import SpeculativeEngine
from clearlm.generation.drafters import DraftModel, PromptLookup
from clearlm.sampling.chain import SamplingParams
from clearlm.serve import create_app

EDIT = (
    "Fix the spelling in this paragraph and give it back whole:\n\n"
    "Alice was begining to get very tired of siting by her sister on the bank, and of having "
    "nothing to do: once or twice she had peeped into the book her sister was reading, but it "
    "had no pictures or conversations in it."
)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``clearlm ARGS`` through the CLI's entry point, in this process (a subprocess spends
    ~2.5 s importing torch; what is checked here is what a command prints and returns)."""
    return run_clearlm(*args, text=True)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("specli") / "t.gguf", context_length=256)


def test_smollm2_greedy_with_prompt_lookup_equals_plain(smollm2):
    plain = smollm2.chat(EDIT, max_new_tokens=64, temperature=0)
    spec = smollm2.chat(EDIT, max_new_tokens=64, temperature=0, prompt_lookup=True)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.speculative.accepted > 10  # the answer copies the paragraph: drafts are kept
    assert spec.speculative.steps < len(spec.tokens) - 1


def test_cli_prompt_lookup_prints_the_plain_text_and_its_counts():
    """The default model with compact weights (the CLI's default load)."""
    plain = cli("chat", EDIT, "-n", "40", "--temperature", "0", "--json")
    spec = cli("chat", EDIT, "-n", "40", "--temperature", "0", "--json", "--prompt-lookup",
               "--num-draft", "6")
    assert plain.returncode == spec.returncode == 0, spec.stderr
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)
    assert b["token_ids"] == a["token_ids"] and "speculative" not in a
    s = b["speculative"]
    assert 0 < s["accepted"] <= s["drafted"]
    assert s["acceptance_rate"] == s["accepted"] / s["drafted"]
    shown = cli("chat", EDIT, "-n", "20", "--temperature", "0", "--prompt-lookup")
    assert "drafts kept" in shown.stderr and "tokens/pass" in shown.stderr


def test_cli_refuses_bad_combinations_in_one_line(tiny_path):
    both = cli("generate", "hi", "-m", str(tiny_path), "--draft", str(tiny_path),
               "--prompt-lookup")  # fmt: skip
    assert both.returncode == 2 and "not both" in both.stderr
    served = cli("serve", str(tiny_path), "--draft", str(tiny_path), "--prompt-lookup")
    assert served.returncode == 2 and "not both" in served.stderr  # before binding a port
    alone = cli("generate", "hi", "-m", str(tiny_path), "--num-draft", "3")
    assert alone.returncode == 2 and "--num-draft needs" in alone.stderr
    compiled = cli("chat", "hi", "-m", str(tiny_path), "--prompt-lookup", "--compile")
    assert compiled.returncode == 2 and "leave one out" in compiled.stderr
    missing = cli("generate", "hi", "-m", str(tiny_path), "--draft", "/nonexistent.gguf")
    assert missing.returncode == 3 and "draft model file not found" in missing.stderr


def test_cli_refuses_a_draft_with_another_tokenizer():
    """Qwen2.5-Coder-0.5B cannot be drafted for by SmolLM2: one line, exit code 7."""
    proc = cli("generate", "def f(x):", "-m", "qwen2.5-coder-0.5b-instruct", "--draft",
               "smollm2-135m-instruct", "-n", "2", "-q")  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "another tokenizer (49152 tokens, the target 151936)" in lines[0]
    assert "Traceback" not in proc.stderr


def test_cli_draft_model_equals_plain(tiny_path):
    plain = cli("generate", "hello", "-m", str(tiny_path), "-n", "20", "--temperature", "0", "-q")
    spec = cli("generate", "hello", "-m", str(tiny_path), "-n", "20", "--temperature", "0", "-q",
               "--draft", str(tiny_path), "--num-draft", "3")  # fmt: skip
    assert plain.returncode == spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout


def test_chat_conversation_with_prompt_lookup_answers_as_without(tiny_path):
    def converse(*extra: str) -> subprocess.CompletedProcess:
        return run_clearlm("chat", "-m", str(tiny_path), "-n", "12", "-q", "--temperature", "0",
                           *extra, stdin=b"hello\nhello again\n", text=True)  # fmt: skip

    plain, spec = converse(), converse("--prompt-lookup", "--num-draft", "4")
    assert plain.returncode == spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout and len(plain.stdout) > 2


def test_engine_tokens_equal_the_serial_engines(tiny_path):
    tiny = clearlm.load(tiny_path)
    greedy, sampled = SamplingParams(temperature=0), SamplingParams(temperature=0.8, seed=3)
    plain = SerialEngine(tiny.transformer, eos_ids=[])
    spec = SpeculativeEngine(tiny.transformer, [], DraftModel(tiny.transformer, 4))
    for engine in (plain, spec):
        engine.add(Request("a", [5, 6, 7], greedy, 12, top_logprobs=3))
        engine.add(Request("b", list(range(10, 252)), greedy, 30))  # 242 tokens: room for 14
        engine.add(Request("c", [8, 9], sampled, 5))
    out = {}
    for name, engine in (("plain", plain), ("spec", spec)):
        events = []
        while engine.has_work():
            events += engine.step()
        out[name] = events
    a, b = out["plain"], out["spec"]
    assert [e.request_id for e in b] == ["a"] * 12 + ["b"] * 14 + ["c"] * 5
    same = [(e.token, e.finish_reason) for e in a if e.request_id != "c"]
    assert [(e.token, e.finish_reason) for e in b if e.request_id != "c"] == same
    for x, y in zip(a[:12], b[:12], strict=True):
        assert y.logprob == pytest.approx(x.logprob, abs=1e-4)
        assert [t for t, _ in y.top_logprobs] == [t for t, _ in x.top_logprobs]
    assert b[-1].finish_reason == "length" and spec.stats.accepted == spec.stats.drafted > 0


def test_server_with_prompt_lookup_answers_as_without(tiny_path):
    """An OpenAI client against a server whose engine decodes speculatively: the same text."""
    openai = pytest.importorskip("openai")
    tiny = clearlm.load(tiny_path)
    texts = []
    for engine in (None, SpeculativeEngine(tiny.transformer, tiny.tokenizer.eos_ids,
                                           PromptLookup(5))):  # fmt: skip
        with serving(create_app(tiny, engine, model_id="tiny")) as url:
            client = openai.OpenAI(base_url=url, api_key="none")
            r = client.completions.create(model="tiny", prompt="hello hello hel", max_tokens=16,
                                          temperature=0)  # fmt: skip
            texts.append(r.choices[0].text)
    assert texts[0] == texts[1] and texts[0]


def test_smollm2_drafting_for_itself_keeps_every_draft(smollm2):
    """The draft path on a real model: q = p, so every draft is kept and the rollback of the
    draft's own cache is exercised by the bonus tokens; the tokens are plain greedy's."""
    plain = smollm2.chat("Write a haiku about the sea.", max_new_tokens=40, temperature=0)
    spec = smollm2.chat("Write a haiku about the sea.", max_new_tokens=40, temperature=0,
                        draft=smollm2,
                        num_draft=4)  # fmt: skip
    assert spec.tokens == plain.tokens
    s = spec.speculative
    assert s.accepted == s.drafted > 0 and s.steps <= -(-(len(spec.tokens) - 1) // 5) + 1


@pytest.mark.large
def test_qwen15_greedy_with_the_05b_draft_equals_plain():
    """The pairing the option is for: Qwen2.5-Coder-0.5B drafting for the 1.5B (same
    tokenizer), greedy on a code prompt, the same tokens as plain decoding."""
    target = clearlm.load("qwen2.5-coder-1.5b-instruct")
    draft = clearlm.load("qwen2.5-coder-0.5b-instruct")
    prompt = "Write a Python function that returns the n-th Fibonacci number, iteratively."
    plain = target.chat(prompt, max_new_tokens=96, temperature=0)
    spec = target.chat(prompt, max_new_tokens=96, temperature=0, draft=draft)
    assert spec.tokens == plain.tokens
    assert spec.speculative.acceptance_rate > 0.5
