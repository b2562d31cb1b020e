"""Speculative decoding (clearlm.generation.speculative, .drafters): greedy output equals plain
greedy decoding token for token; sampled output has plain sampling's distribution; the KV cache
rolls back; stops, end ids and limits behave as in plain decoding; bad options are refused."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from tiny_gguf import write_tiny_llama

import clearlm
from clearlm.errors import SamplingParamsError
from clearlm.generation.drafters import (
    DraftModel,
    PromptLookup,
    SpeculativeStats,
    check_same_vocabulary,
    find_continuation,
)
from clearlm.generation.loop import generate, generate_step
from clearlm.generation.speculative import (
    accept_greedy,
    accept_sampled,
    speculative_generate,
    speculative_steps,
)
from clearlm.sampling.chain import filter_logits, make_sampler, softmax
from clearlm.sampling.params import SamplingParams

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target (4 blocks) and a draft of the same vocabulary: the same seed with 3 blocks,
    so its embedding and first blocks are the target's and its top tokens overlap the
    target's in part (both acceptance and refusal happen)."""
    d = tmp_path_factory.mktemp("spec")
    target = clearlm.load(write_tiny_llama(d / "t.gguf", n_layers=4, context_length=64))
    draft = clearlm.load(write_tiny_llama(d / "d.gguf", n_layers=3, context_length=64))
    return target, draft


def drafters(pair):
    target, draft = pair
    return {
        "lookup": PromptLookup(num_draft=4),
        "draft": DraftModel(draft.transformer, num_draft=3),
        "self": DraftModel(target.transformer, num_draft=4),  # q = p: every draft is kept
    }


# --- the pure parts ------------------------------------------------------------------------


def test_find_continuation_takes_the_latest_longest_match():
    h = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert find_continuation(h, 2, max_ngram=3) == [7, 8]  # latest earlier "1 2 3"
    assert find_continuation(h, 10, max_ngram=3) == [7, 8, 5, 1, 2, 3]  # up to the end
    assert find_continuation([4, 5, 6, 5], 3, max_ngram=3, min_ngram=1) == [6, 5]  # n = 1
    assert find_continuation([4, 5, 6, 7], 3) == []
    assert find_continuation([4, 5, 6, 5], 3, max_ngram=3, min_ngram=2) == []


def test_accept_greedy_keeps_the_agreeing_prefix_and_adds_the_target_token():
    p = torch.full((4, 6), -1.0)
    for row, best in enumerate([2, 5, 1, 3]):
        p[row, best] = 1.0
    assert accept_greedy([2, 5, 1], p) == (3, 3)  # all kept, bonus from the last row
    assert accept_greedy([2, 4, 1], p) == (1, 5)  # refused at d_2: the target's own choice
    assert accept_greedy([0, 5, 1], p) == (0, 2)
    assert accept_greedy([], p[:1]) == (0, 2)  # nothing drafted: a plain step


def chi_square_limit(df: int, z: float = 3.719) -> float:
    """The chi-square quantile at 1 - 1e-4 (z = 3.719), Wilson-Hilferty approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_matches(counts: Counter, exact: dict, n: int) -> None:
    """Pearson's chi-square of the counts against the exact probabilities (cells expected
    below 5 pooled) is below its 1 - 1e-4 quantile."""
    stat, df, pool_e, pool_o = 0.0, -1, 0.0, 0
    for cell, prob in exact.items():
        e, o = prob * n, counts.get(cell, 0)
        if e < 5:
            pool_e, pool_o = pool_e + e, pool_o + o
            continue
        stat, df = stat + (o - e) ** 2 / e, df + 1
    if pool_e > 0:
        stat, df = stat + (pool_o - pool_e) ** 2 / pool_e, df + 1
    assert sum(counts.values()) == n and set(counts) <= set(exact)
    assert stat < chi_square_limit(df), (stat, df)


def test_accept_sampled_gives_the_target_chain_distribution():
    """The rule alone, on a Markov chain over 4 tokens: drafts from Q, target rows from P.
    The tokens it emits (kept drafts, then the correction or bonus) follow P exactly; a rule
    that kept every draft would follow Q, which is far from P."""
    g = torch.Generator().manual_seed(0)
    P = torch.tensor([[.6, .2, .1, .1], [.1, .1, .7, .1], [.25, .25, .25, .25], [.0, .5, .0, .5]])
    Q = torch.tensor([[.1, .6, .2, .1], [.4, .1, .4, .1], [.1, .1, .1, .7], [.3, .2, .3, .2]])
    n, counts = 6000, Counter()
    for _ in range(n):
        d1 = int(torch.multinomial(Q[0], 1, generator=g))
        d2 = int(torch.multinomial(Q[d1], 1, generator=g))
        kept, token = accept_sampled([d1, d2], P[[0, d1, d2]], Q[[0, d1]], g)
        out = [d1, d2][:kept] + [token]
        if len(out) < 2:  # refused at d_1: the next token comes from P after the correction
            out.append(int(torch.multinomial(P[out[0]], 1, generator=g)))
        counts[tuple(out[:2])] += 1
    exact = {(a, b): float(P[0, a] * P[a, b]) for a, b in itertools.product(range(4), repeat=2)}
    assert_matches(counts, exact, n)
    draft_only = {(a, b): float(Q[0, a] * Q[a, b]) for a, b in exact}
    assert sum(abs(exact[c] - draft_only[c]) for c in exact) / 2 > 0.4


# --- greedy: the same tokens as plain decoding ----------------------------------------------


@pytest.mark.parametrize("kind", ["lookup", "draft", "self"])
@pytest.mark.parametrize("prompt", ["hello hello hello", "abcabcabcab", "the cat sat"])
def test_greedy_equals_plain_greedy(pair, kind, prompt):
    target = pair[0]
    ids = target.encode(prompt)
    plain = generate(target.transformer, target.tokenizer, ids, GREEDY, 40)
    spec = speculative_generate(
        target.transformer, target.tokenizer, ids, GREEDY, 40, drafters(pair)[kind]
    )
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert spec.finish_reason == plain.finish_reason
    assert spec.logprobs == pytest.approx(plain.logprobs, abs=1e-4)
    s = spec.speculative
    assert s.steps < len(spec.tokens) - 1 or s.drafted == 0
    if kind == "self":  # the target drafting for itself: every draft kept, k + 1 per pass
        assert s.accepted == s.drafted > 0 and s.steps == math.ceil(39 / 5)


def test_greedy_with_a_repetition_penalty_equals_plain(pair):
    """Each verified row is filtered with its own history (the drafts before it)."""
    target = pair[0]
    ids = target.encode("abcabcabc")
    params = SamplingParams(temperature=0, repetition_penalty=1.3, frequency_penalty=0.5)
    plain = generate(target.transformer, target.tokenizer, ids, params, 30)
    for drafter in drafters(pair).values():
        spec = speculative_generate(target.transformer, target.tokenizer, ids, params, 30, drafter)
        assert spec.tokens == plain.tokens


def test_rollback_leaves_the_cache_as_a_fresh_run(pair):
    """After a refused draft is truncated away, the cache's keys give the logits of a run
    that never saw it."""
    model = pair[0].transformer
    ids = torch.tensor([pair[0].encode("hello there")])  # (1, P)
    cache = model.new_cache(1, 32)
    with torch.inference_mode():
        model(ids, cache=cache)
        model(torch.tensor([[7, 8, 9]]), cache=cache)  # three drafts ...
        cache.truncate(ids.shape[1] + 1)  # ... of which one is kept
        got = model(torch.tensor([[40]]), cache=cache)[0, -1]
        fresh = model(torch.cat([ids, torch.tensor([[7, 40]])], dim=1))[0, -1]
    assert cache.offset == ids.shape[1] + 2
    torch.testing.assert_close(got, fresh, rtol=1e-5, atol=1e-5)
    with pytest.raises(clearlm.errors.ContextLengthError):
        cache.truncate(33)


def test_stops_end_ids_and_limits_as_in_plain_decoding(pair):
    target = pair[0]
    plain = target.generate("hello", max_new_tokens=30, temperature=0)
    stop = plain.text[6:9]
    cut = target.generate("hello", max_new_tokens=30, temperature=0, stop=stop)
    for kw in (dict(prompt_lookup=True), dict(draft=target, num_draft=6)):
        res = target.generate("hello", max_new_tokens=30, temperature=0, stop=stop, **kw)
        assert (res.text, res.tokens, res.finish_reason) == (cut.text, cut.tokens, "stop")
        for n in (0, 1, 2, 7):
            a = target.generate("hello", max_new_tokens=n, temperature=0, **kw)
            assert a.tokens == plain.tokens[:n] and a.finish_reason == "length"
    # an end id in the middle of a fully accepted draft: nothing after it is shown
    eos = plain.tokens[4]
    tok = replace(target.tokenizer, eos_ids=frozenset({eos}))
    ids = target.encode("hello")
    want = generate(target.transformer, tok, ids, GREEDY, 30)
    got = speculative_generate(
        target.transformer, tok, ids, GREEDY, 30, DraftModel(target.transformer, 8)
    )
    assert got.finish_reason == want.finish_reason == "eos"
    assert got.tokens == want.tokens == plain.tokens[: plain.tokens.index(eos) + 1]


def test_stream_and_chat_take_the_same_options(pair):
    target, draft = pair
    chunks = list(target.stream("hello", max_new_tokens=12, temperature=0, draft=draft))
    plain = target.generate("hello", max_new_tokens=12, temperature=0)
    assert [c.token for c in chunks if c.token is not None] == plain.tokens
    lookup = PromptLookup(num_draft=3, max_ngram=2, min_ngram=2)  # its own n-gram lengths
    own = target.generate("hello", max_new_tokens=12, temperature=0, prompt_lookup=lookup)
    assert own.tokens == plain.tokens
    chat = target.chat("hi", max_new_tokens=12, temperature=0, prompt_lookup=True)  # greedy:
    assert chat.tokens == target.chat("hi", max_new_tokens=12, temperature=0).tokens  # equal
    assert chat.speculative is not None and plain.speculative is None
    runs = [target.generate("hello hel", max_new_tokens=16, temperature=0.9, seed=5, draft=draft)
            for _ in range(2)]  # fmt: skip
    assert runs[0].tokens == runs[1].tokens  # a seed reproduces a sampled speculative run


# --- sampled: plain sampling's distribution ------------------------------------------------


def exact_joint(model, prompt: list[int], params: SamplingParams, depth: int) -> dict:
    """P(first `depth` tokens) under plain sampling, by enumerating the filtered distributions."""
    out = {}

    def walk(prefix: tuple, prob: float) -> None:
        if len(prefix) == depth:
            out[prefix] = prob
            return
        with torch.inference_mode():
            logits = model.transformer(torch.tensor([prompt + list(prefix)]))[0, -1]
        p = softmax(filter_logits(logits[None], None, params))[0]
        for t in torch.nonzero(p).flatten().tolist():
            walk((*prefix, t), prob * float(p[t]))

    walk((), 1.0)
    return out


SAMPLED = SamplingParams(temperature=0.5, top_k=3)
SEEDS = 500


@pytest.mark.parametrize("kind", ["draft", "lookup"])
def test_sampled_tokens_have_plain_sampling_distribution(pair, kind):
    """Over 500 seeds, the first 3 tokens of speculative sampling (a verify pass of k = 2
    drafts, so refusals at d_1 and d_2 and the bonus all occur) against the exact joint
    probabilities of plain sampling (the next test checks plain sampling against them)."""
    target = pair[0]
    prompt = target.encode("hello hel")  # "hel" repeats: the lookup drafts
    exact = exact_joint(target, prompt, SAMPLED, 3)
    counts, stats = Counter(), SpeculativeStats()
    for seed in range(SEEDS):
        drafter = drafters(pair)[kind]
        drafter.num_draft = 2
        p = replace(SAMPLED, seed=seed)
        steps = speculative_steps(target.transformer, prompt, p, 4, drafter, stats)
        counts[tuple(t for t, _ in itertools.islice(steps, 3))] += 1
    assert 0 < stats.accepted < stats.drafted  # both kept and refused drafts were tested
    assert_matches(counts, exact, SEEDS)


def test_plain_sampling_matches_the_exact_joint(pair):
    """The reference of the test above: plain sampling's counts over the same seeds."""
    target = pair[0]
    prompt = target.encode("hello hel")
    counts = Counter()
    for seed in range(SEEDS):
        sampler = make_sampler(replace(SAMPLED, seed=seed))
        counts[tuple(t for t, _ in generate_step(target.transformer, prompt, sampler, 3))] += 1
    assert_matches(counts, exact_joint(target, prompt, SAMPLED, 3), SEEDS)


# --- options and errors --------------------------------------------------------------------


def test_bad_options_are_refused(pair, tmp_path):
    target, draft = pair
    cases = [
        (dict(draft=draft, prompt_lookup=True), "not both"),
        (dict(num_draft=3), "num_draft needs"),
        (dict(draft="qwen"), "draft must be a loaded Model"),
        (dict(prompt_lookup="yes"), "prompt_lookup must be True, False or a PromptLookup"),
        (dict(prompt_lookup=PromptLookup(), num_draft=3), "sets its own num_draft"),
        (dict(prompt_lookup=True, num_draft=0), "num_draft must be an integer ≥ 1"),
    ]
    for kw, msg in cases:
        with pytest.raises(SamplingParamsError, match=msg):
            target.generate("hi", max_new_tokens=2, **kw)
    with pytest.raises(SamplingParamsError, match="one prompt at a time"):
        target.generate(["hi", "yo"], max_new_tokens=2, prompt_lookup=True)
    tokens = [*target.tokenizer.tokens]
    tokens[65] = "Z"
    other = replace(target.tokenizer, tokens=tokens)
    with pytest.raises(SamplingParamsError, match="token 65 is 'Z'.*same vocabulary"):
        check_same_vocabulary(target.tokenizer, other, "other.gguf")
