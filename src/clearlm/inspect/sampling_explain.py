"""The sampling decision, explained: what each step of the chain in sampling.py kept.

Runs the steps of :func:`clearlm.sampling.chain.sampling_chain` (the list ``filter_logits`` runs)
one
at a time, then picks with :func:`clearlm.sampling.chain.pick` as ``make_sampler`` does, so the
explanation is of the real decision: there is no second copy of the order, seeding or checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from clearlm.errors import SamplingParamsError
from clearlm.sampling.chain import SamplingParams, make_generator, pick, sampling_chain, softmax
from clearlm.sampling.params import is_int


@dataclass(frozen=True)
class SamplingStep:
    """One step of the sampling chain and the distribution it leaves behind.

    Attributes:
        name: "logits" (the distribution before any step), or a chain step's name
            ("logit_bias", "grammar", "repetition_penalty", "temperature", "top_k", ...).
        setting: the step's setting as ``SamplingParams`` holds it; None for "logits".
        active: False when the setting means "off" (or, for the penalty, there is no history),
            so the step returned its input unchanged.
        kept: ids still possible after the step (logit not -inf), ascending; never empty.
        removed: ids this step made impossible (possible before it, -inf after), ascending.
        top: ``(id, probability)`` of the most likely kept tokens after the step, renormalised
            (softmax of the step's logits), most likely first, ties to the lower id.
    """

    name: str
    setting: float | int | None
    active: bool
    kept: tuple[int, ...]
    removed: tuple[int, ...]
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SamplingExplanation:
    """How :func:`explain_sampling` reached one token: each step of the chain, then the pick.

    Attributes:
        params: the settings explained.
        steps: "logits" first, then the chain's steps in the order they ran: all five, or
            only the repetition penalty when greedy (as :func:`filter_logits`). The penalty is
            listed, inactive, when there is no history.
        token: the id picked: argmax when greedy, else the seeded draw.
        probability: its probability under the final (filtered, renormalised) distribution.
        logprob: log of that, exactly what :func:`make_sampler` returns with the token.
        filtered: ``(V,)`` float32, the chain's output (what :func:`filter_logits` returns):
            the pick is made from softmax of it; ``-inf`` where a step removed the token.
    """

    params: SamplingParams
    steps: tuple[SamplingStep, ...]
    token: int
    probability: float
    logprob: float
    filtered: Tensor

    def rows(self, labels: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Plain data for a table (CLI, web page, JSON): one dict per step, then the pick.

        Every row has ``step``, ``setting``, ``active``, ``kept`` (count), ``removed`` (count)
        and ``top``: a list of ``{"id", "label", "p"}``; ``label`` is ``labels[id]`` when
        ``labels`` (the vocabulary's strings) is given, else ``str(id)``. The last row's
        ``step`` is "greedy" (setting None) or "draw" (setting: the seed) and its ``top``
        holds only the picked token.
        """

        def entry(i: int, p: float) -> dict[str, Any]:
            return {"id": i, "label": labels[i] if labels is not None else str(i), "p": p}

        out = [
            {
                "step": s.name,
                "setting": s.setting,
                "active": s.active,
                "kept": len(s.kept),
                "removed": len(s.removed),
                "top": [entry(i, p) for i, p in s.top],
            }
            for s in self.steps
        ]
        greedy_pick = self.params.is_greedy
        out.append(
            {
                "step": "greedy" if greedy_pick else "draw",
                "setting": None if greedy_pick else self.params.seed,
                "active": True,
                "kept": len(self.steps[-1].kept),
                "removed": 0,
                "top": [entry(self.token, self.probability)],
            }
        )
        return out


def _step(
    name: str, setting: float | int | None, active: bool, before: Tensor, after: Tensor, top: int
) -> SamplingStep:
    """Describe the step that turned ``before`` into ``after`` (both ``(V,)`` float32)."""
    was, now = ~torch.isneginf(before), ~torch.isneginf(after)  # (V,) bool
    probs = softmax(after)  # (V,) renormalised over the kept tokens
    order = torch.sort(probs, descending=True, stable=True).indices  # stable: ties to lower id
    n = min(top, int(now.sum()))
    return SamplingStep(
        name=name,
        setting=setting,
        active=active,
        kept=tuple(now.nonzero().flatten().tolist()),
        removed=tuple((was & ~now).nonzero().flatten().tolist()),
        top=tuple((int(i), float(probs[i])) for i in order[:n]),
    )


def explain_sampling(
    logits: Tensor,
    previous_tokens: Tensor | None,
    params: SamplingParams,
    top: int = 10,
    generator: torch.Generator | None = None,
    allowed: Tensor | None = None,
) -> SamplingExplanation:
    """Run :func:`make_sampler`'s chain on one row of logits step by step, and say what each did.

    The steps are :func:`~clearlm.sampling.chain.sampling_chain`'s, the list :func:`filter_logits`
    runs (repetition penalty → temperature → top-k → top-p → min-p, Hugging Face's order; only
    the penalty when greedy), on float32 logits; inactive steps are recorded, unchanged. After
    each step the explanation records which tokens survive and the renormalised probabilities of
    the ``top`` most likely. The pick is :func:`~clearlm.sampling.chain.pick`'s, with a generator
    from
    :func:`~clearlm.sampling.chain.make_generator` seeded as the sampler's own, so it equals a fresh
    sampler's first draw on the same logits and history (tested). Pass ``generator`` to draw
    from an existing one instead.

    Args:
        logits: ``(V,)`` float, one position's logits.
        previous_tokens: ``(S,)`` int64 token history for the repetition penalty, or None.
        params: the settings to explain.
        top: how many of the most likely tokens to list after each step (>= 1).
        generator: a generator on the logits' device to draw with; default a fresh one seeded
            with ``params.seed`` (random when None).
        allowed: ``(V,)`` bool, the tokens a grammar accepts here (structured output,
            :meth:`clearlm.sampling.grammar.GrammarState.allowed`): adds the "grammar" step.

    Raises:
        ValueError: logits are not 1-D. SamplingParamsError: ``top`` < 1.
    """
    if logits.dim() != 1:
        raise ValueError(f"explain_sampling takes (V,) logits, got shape {tuple(logits.shape)}")
    if not (is_int(top) and top >= 1):
        raise SamplingParamsError(f"top must be an integer >= 1, got {top!r}")
    x = logits.to(torch.float32)  # (V,), as filter_logits casts
    steps = [_step("logits", None, False, x, x, top)]
    for s in sampling_chain(params, previous_tokens, None, allowed):
        before = x
        if s.active:
            x = s.fn(x)
        steps.append(_step(s.name, s.setting, s.active, before, x, top))
    if generator is None and not params.is_greedy:
        generator = make_generator(params.seed, logits.device)
    token, logprob = pick(x, params, generator)
    return SamplingExplanation(
        params=params,
        steps=tuple(steps),
        token=int(token),
        probability=float(softmax(x)[token]),
        logprob=float(logprob),
        filtered=x,
    )
