"""Tests for clearlm.inspect.walkthrough and `clearlm walkthrough`: the seeds' worked examples come
out of the real layers with the README's corrected values (../shared/seeds/README.md), and the
command prints them. (tests/model/test_seed_variants.py checks the layers themselves more
widely.)"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from clearlm.inspect import walkthrough as wt
from clearlm.sampling.chain import make_sampler

LOGITS = [0.001, -0.140, 0.537, 0.010, 0.026]
PROBS = [0.178190, 0.154756, 0.304554, 0.179800, 0.182700]


def test_example_1_heads_concatenated():
    ex = wt.heads_example()
    assert ex.heads[0] == pytest.approx((0.031, 0.111), abs=1e-6)
    assert ex.heads[1] == pytest.approx((-0.08, 1.231), abs=1e-6)
    assert ex.concat == pytest.approx((0.031, 0.111, -0.08, 1.231), abs=1e-6)


def test_example_2_layernorm():
    ex = wt.layernorm_example()
    assert ex.mean == pytest.approx(0.32325, abs=1e-12)
    assert ex.variance == pytest.approx(0.27927019, abs=1e-8)
    assert ex.std == pytest.approx(math.sqrt(0.27927019 + 1e-5), abs=1e-8)
    assert ex.output == pytest.approx((-0.553012, -0.401631, -0.763052, 1.717696), abs=1e-6)
    assert ex.document_variance == 0.27925  # what the document prints, kept for the note
    assert ex.document_std == pytest.approx(math.sqrt(0.27925), abs=1e-7)  # it leaves out ε


def test_example_3_relu():
    ex = wt.relu_example()
    expected = (0.31, 0, 0.42, 0, 0.55, 0.08, 0, 0.97)
    assert ex.relu == pytest.approx(expected, abs=1e-6)
    assert ex.ffn == pytest.approx(expected, abs=1e-6)


def test_example_4_output_projection():
    ex = wt.output_example()
    assert ex.words == ("。", "，", "但是", "所以", "呢")
    assert ex.logits == pytest.approx(LOGITS, abs=1e-6)
    assert ex.probs == pytest.approx(PROBS, abs=1e-6)
    assert ex.greedy_id == 2 and ex.greedy_word == "但是"
    assert ex.document_logits == (-0.006, -0.156, 0.549, 0.086, 0.024)
    assert ex.document_greedy_id == 2  # "greedy picks 但是 either way"
    assert ex.document_probs[2] == pytest.approx(0.304, abs=1e-3)  # the document's 30.4%


def test_sinusoidal_row_and_causal_mask():
    rows = wt.sinusoidal_rows(4, 4)
    assert rows[0] == pytest.approx((0, 1, 0, 1), abs=1e-6)
    assert rows[1] == pytest.approx(
        (math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)), abs=1e-6
    )
    assert wt.causal_mask(4) == tuple(tuple(s <= t for s in range(4)) for t in range(4))


def test_sampling_scenarios_on_example_4():
    scenarios = {sc.label: sc for sc in wt.sampling_scenarios()}
    final = {label: sc.explanation.steps[-1] for label, sc in scenarios.items()}
    assert final["top-k 2"].kept == (2, 4)
    assert dict(final["top-k 2"].top)[2] == pytest.approx(0.304554 / 0.487254, abs=1e-6)
    assert final["top-p 0.5"].kept == (2, 3, 4)
    assert final["top-p 0.9"].kept == (0, 1, 2, 3, 4)
    w = [math.exp(z / 0.5) for z in LOGITS]
    assert dict(final["temperature 0.5"].top)[2] == pytest.approx(w[2] / sum(w), abs=1e-6)
    assert scenarios["greedy"].draws == (2,) * 10
    assert scenarios["greedy"].draw_probs() == {2: 1.0}  # greedy always picks the argmax
    assert scenarios["top-k 2"].draw_probs() == dict(final["top-k 2"].top)
    assert scenarios["greedy"].explanation.token == 2
    for sc in scenarios.values():  # each draw is what a fresh sampler with that seed picks
        assert set(sc.draws) <= set(sc.explanation.steps[-1].kept)
        for seed in (0, 5):
            token, _ = make_sampler(replace(sc.params, seed=seed))(torch.tensor(LOGITS), None)
            assert sc.draws[seed] == int(token)


def test_cli_walkthrough_prints_the_steps():
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "walkthrough"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in (
        "[0.031, 0.111, -0.080, 1.231]",
        "0.32325",
        "0.27927019",
        "0.27925",
        "-0.553012",
        "-0.401631",
        "-0.763052",
        "0.537",
        "-0.140",
        "0.549",
        "0.304554",
        "0.178190",
        "0.841471",
        "但是",
        "Greedy (argmax): 但是",
        "top-k 2",
        "top-p 0.9",
        "temperature 0.5",
    ):
        assert needle in out, needle


def test_cli_walkthrough_greedy_row_is_one_on_the_argmax_and_stage_5_appears_once():
    proc = subprocess.run(
        [sys.executable, "-m", "clearlm", "walkthrough"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("│ greedy"))
    cells = [c.strip() for c in row.strip("│ ").split("│")][1:]  # 。 ， 但是 所以 呢
    assert cells == ["–", "–", "1.0000", "–", "–"]
    assert proc.stdout.count("Stage 5") == 1
