"""Activation patching: which activations carry the difference between two prompts.

Two prompts of the same token count differ in a few tokens (*clean* "The Eiffel Tower is in the
city of", *corrupted* "The Colosseum is in the city of") and the model answers differently
(" Paris" / " Rome"). The logit difference at the last position,
LD = logit[answer] − logit[wrong], measures the answer. Patching runs the corrupted prompt again
with one activation — one hook point at one position — replaced by its value from the clean run,
and reports how much of the answer that one activation brings back:

    recovery = (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted)

1 means the activation alone carries everything the corruption changed; 0 means it carries none
of it (Wang et al. 2022, "Interpretability in the Wild", IOI, §3; Heimersheim & Nanda 2024, "How
to use and interpret activation patching", §2, logit difference as the recommended metric).

Every patched run is one row of a batch: the corrupted prompt repeated B times, and on each hook
point a hook (clearlm.model.hooks) that writes the clean activation into the rows that patch that
point, at their own position. A grid of P points × Q positions is P·Q rows, ⌈P·Q / batch_size⌉
forward passes. Shape letters: T prompt tokens, P hook points, Q positions, B rows in a batch.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from clearlm.errors import ClearLMError
from clearlm.model.hook_aliases import lens_target
from clearlm.model.hooks import HOOK_POINTS, check_hook_name
from clearlm.model.transformer import Transformer

BATCH_SIZE = 64  # patched copies of the corrupted prompt per forward pass
# The per-block kinds `expand_points` accepts ("resid_pre" → every block's blocks.{i}.resid_pre).
BLOCK_KINDS = tuple(n.removeprefix("blocks.{i}.") for n in HOOK_POINTS if n.startswith("blocks."))


@dataclass(frozen=True)
class PatchResult:
    """The recovery grid of one clean/corrupted pair.

    Attributes:
        points: the P hook point names (rows), e.g. ``blocks.3.resid_pre``.
        positions: the Q token positions (columns), 0 … T−1.
        recovery: (P, Q) float32: (LD_patched − LD_corrupted) / (LD_clean − LD_corrupted).
        patched: (P, Q) float32: LD_patched, the logit difference of each patched run (logits).
        clean_diff: LD_clean, the clean prompt's logit difference (float, logits).
        corrupted_diff: LD_corrupted, the corrupted prompt's.
        clean_tokens, corrupted_tokens: the T tokens of each prompt as strings.
        answer, wrong: the two tokens compared, as strings; answer_id, wrong_id their ids.
    """

    points: list[str]
    positions: list[int]
    recovery: torch.Tensor
    patched: torch.Tensor
    clean_diff: float
    corrupted_diff: float
    clean_tokens: list[str]
    corrupted_tokens: list[str]
    answer: str
    wrong: str
    answer_id: int
    wrong_id: int

    def column_labels(self) -> list[str]:
        """One label per position: ``3 ' Tower'``, or ``1 ' E'→' Col'`` where the prompts differ
        (clean token first)."""
        out = []
        for p in self.positions:
            a, b = self.clean_tokens[p], self.corrupted_tokens[p]
            out.append(f"{p} {a!r}" if a == b else f"{p} {a!r}→{b!r}")
        return out

    def table(self) -> str:
        """The grid as plain text: a header line with the three logit differences, then one row
        per hook point, one column per position (recovery to two decimals)."""
        head = (
            f"logit[{self.answer!r}] − logit[{self.wrong!r}] at the last position: clean "
            f"{self.clean_diff:.3f}, corrupted {self.corrupted_diff:.3f}"
        )
        labels = self.column_labels()
        width = max(6, *(len(c) for c in labels)) if labels else 6
        first = max(len("hook point"), *(len(p) for p in self.points))
        lines = [head, "hook point".ljust(first) + "".join(f" {c:>{width}}" for c in labels)]
        for name, row in zip(self.points, self.recovery.tolist(), strict=True):
            row = [round(v, 2) + 0.0 for v in row]  # + 0.0: −0.001 prints as 0.00, not −0.00
            lines.append(name.ljust(first) + "".join(f" {v:>{width}.2f}" for v in row))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data: every field, tensors as nested lists (rows: points)."""
        return {
            "points": list(self.points),
            "positions": list(self.positions),
            "recovery": self.recovery.tolist(),
            "patched": self.patched.tolist(),
            "clean_diff": self.clean_diff,
            "corrupted_diff": self.corrupted_diff,
            "clean_tokens": list(self.clean_tokens),
            "corrupted_tokens": list(self.corrupted_tokens),
            "answer": {"id": self.answer_id, "text": self.answer},
            "wrong": {"id": self.wrong_id, "text": self.wrong},
        }


def expand_points(spec: str | Sequence[str], n_layers: int) -> list[str]:
    """Hook point names from names or per-block kinds, in the order given.

    A full name (``blocks.3.attn.out``, ``embed``) stays itself; a kind (``resid_pre``,
    ``attn.out``, ``ffn.out``: a name without ``blocks.{i}.``) stands for that point in every
    block, block 0 first. One string is one entry.

    Raises:
        ClearLMError: an empty list, an unknown name or kind (naming the kinds), ``pos`` or
        ``probs`` (no batch axis to patch: they are not computed per row), a point named twice
        (``resid_pre,resid_pre``, or a TransformerLens name and the clearlm name it stands for).
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    if not items:
        raise ClearLMError(
            "no hook points to patch; name some, e.g. 'resid_pre' or 'blocks.0.attn.out'"
        )
    out: list[str] = []
    given: list[str] = []  # the item each name of `out` came from
    for item in items:
        if not isinstance(item, str):
            raise ClearLMError(f"a hook point is a name such as 'resid_pre', got {item!r}")
        if item in BLOCK_KINDS:
            out += [f"blocks.{i}.{item}" for i in range(n_layers)]
            given += [item] * n_layers
            continue
        if item in ("pos", "probs"):
            raise ClearLMError(
                f"hook point {item!r} cannot be patched (it has no batch axis); patch 'embed' "
                "or 'blocks.0.resid_pre' instead"
            )
        try:
            check_hook_name(item, n_layers)
        except ClearLMError as e:
            raise ClearLMError(
                f"{e} — or a kind patched in every block: {', '.join(BLOCK_KINDS)}"
            ) from None
        out.append(item)
        given.append(item)
    refuse_duplicates([lens_target(n) or n for n in out], given)
    return out


def refuse_duplicates(points: Sequence[str], given: Sequence[str]) -> None:
    """ClearLMError naming the first point that appears twice in ``points`` (clearlm names,
    aliases resolved), and the two entries ``given`` (as typed) it came from.

    Why: a patching batch keeps one hook per point, so a second entry would silently replace
    the first one's hook and leave its rows unpatched."""
    first: dict[str, str] = {}
    for name, item in zip(points, given, strict=True):
        if name in first:
            how = f"{first[name]!r} and {item!r}" if first[name] != item else f"{item!r} twice"
            raise ClearLMError(
                f"hook point {name!r} is named more than once ({how}); name each point once"
            )
        first[name] = item


def as_index(value: object) -> int | None:
    """An int from an int or an integer scalar (numpy's, a 0-d integer torch tensor); None for
    anything else (bools, floats, strings, lists)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:  # a float tensor or one of several elements
        return None


def check_batch_size(value: object) -> int:
    """``batch_size`` as an int ≥ 1; ClearLMError (naming the value) otherwise."""
    n = as_index(value)
    if n is None or n < 1:
        raise ClearLMError(
            f"batch_size is a whole number of patched runs per forward pass, at least 1; got "
            f"{value!r}"
        )
    return n


def token_axis(name: str) -> int:
    """The axis of the token positions T in hook point ``name``'s tensor (HOOK_POINTS' shape):
    1 for (B, T, D), 2 for (B, H, T, Hd) and the attention scores and pattern (queries)."""
    template = re.sub(r"^blocks\.\d+\.", "blocks.{i}.", name)
    letters = [s.strip() for s in HOOK_POINTS[template][0].strip("()").split(",")]
    return letters.index("T")


def _patch_fn(
    clean: torch.Tensor, axis: int, rows: torch.Tensor, positions: torch.Tensor
) -> Callable[[torch.Tensor, str], torch.Tensor]:
    """A hook writing the clean activation into ``rows`` at their own ``positions``.

    clean: the clean run's (1, …) tensor at this point; rows, positions: (n,) int64, row r of the
    batch patches position positions[r]."""
    rows, positions = rows.to(clean.device), positions.to(clean.device)
    source = clean.movedim(axis, 1)[0, positions]  # (1, T, …) → (n, …): the clean values

    def fn(x: torch.Tensor, _: str) -> torch.Tensor:
        out = x.clone()
        out.movedim(axis, 1)[rows, positions] = source.to(x.dtype)  # a view of `out`: (B, T, …)
        return out

    return fn


def _logit_diff(logits: torch.Tensor, answer: int, wrong: int) -> torch.Tensor:
    """(B, T, V) logits → (B,) float32 logit[answer] − logit[wrong] at the last position."""
    last = logits[:, -1].float()  # (B, V)
    return last[:, answer] - last[:, wrong]


@torch.inference_mode()
def patch_activations(
    transformer: Transformer,
    clean: Sequence[int],
    corrupted: Sequence[int],
    points: Sequence[str],
    positions: Sequence[int],
    answer: int,
    wrong: int,
    *,
    batch_size: int = BATCH_SIZE,
    text: Callable[[Sequence[int]], list[str]] | None = None,
) -> PatchResult:
    """Patch every (point, position) of the grid from the clean run into the corrupted run.

    Args:
        transformer: the model; its hooks (``transformer.hooks``) are used, and removed after.
        clean, corrupted: token ids, the same count T (checked by the caller).
        points: P hook point names (expand_points), each with a batch axis.
        positions: Q positions in [0, T).
        answer, wrong: token ids; LD = logit[answer] − logit[wrong] at the last position.
        batch_size: patched runs per forward pass (≥ 1); any value gives the same grid, up to
            float rounding of batched matrix products.
        text: ids → strings for the result's tokens (default: the ids as text).

    Returns:
        :class:`PatchResult`, recovery (P, Q) float32.

    Raises:
        ClearLMError: LD_clean = LD_corrupted (recovery undefined), a hook point the model
        lacks or one named twice (aliases resolved), batch_size < 1.
    """
    batch_size = check_batch_size(batch_size)
    hooks = transformer.hooks
    # ClearLMError for a name this model lacks, before any run; each point's own name after
    given, points = list(points), [hooks.point(name).name for name in points]
    refuse_duplicates(points, given)
    # Projecting only the last position saves a (T−1) × D × V product, unless a point at or
    # after the final norm is patched (its position axis is then the whole prompt).
    last_only = not {"final_norm", "logits"} & set(points)
    clean_ids = torch.tensor([list(clean)], device=transformer.device)  # (1, T)
    bad_ids = torch.tensor([list(corrupted)], device=transformer.device)  # (1, T)
    with hooks.recording(set(points)) as cache:
        clean_diff = float(_logit_diff(transformer(clean_ids, last_only=last_only), answer, wrong))
    corrupted_diff = float(_logit_diff(transformer(bad_ids, last_only=last_only), answer, wrong))
    span = clean_diff - corrupted_diff
    if abs(span) <= 1e-6 * max(1.0, abs(clean_diff)):
        raise ClearLMError(
            f"the clean and corrupted prompts give the same logit difference ({clean_diff:.4f}); "
            "pick a corruption that changes which of answer and wrong the model prefers"
        )
    grid = [(p, q) for p in range(len(points)) for q in range(len(positions))]  # P·Q rows
    patched = torch.empty(len(grid), dtype=torch.float32)
    for start in range(0, len(grid), batch_size):
        chunk = grid[start : start + batch_size]
        fns = {}
        for p in sorted({p for p, _ in chunk}):
            rows = [r for r, (pp, _) in enumerate(chunk) if pp == p]
            where = [positions[chunk[r][1]] for r in rows]
            name = points[p]
            fns[name] = _patch_fn(cache[name], token_axis(name), torch.tensor(rows),
                                  torch.tensor(where))  # fmt: skip
        tokens = bad_ids.expand(len(chunk), -1)  # (B, T): the corrupted prompt, B times
        with hooks.temporary(fns):
            logits = transformer(tokens, last_only=last_only)  # (B, T or 1, V)
        patched[start : start + len(chunk)] = _logit_diff(logits, answer, wrong).cpu()
    patched = patched.view(len(points), len(positions))  # (P·Q,) → (P, Q)
    text = text or (lambda ids: [str(i) for i in ids])
    return PatchResult(
        points=list(points),
        positions=list(positions),
        recovery=(patched - corrupted_diff) / span + 0.0,  # + 0.0: no −0.0 where nothing moved
        patched=patched,
        clean_diff=clean_diff,
        corrupted_diff=corrupted_diff,
        clean_tokens=text(list(clean)),
        corrupted_tokens=text(list(corrupted)),
        answer=text([answer])[0],
        wrong=text([wrong])[0],
        answer_id=answer,
        wrong_id=wrong,
    )
