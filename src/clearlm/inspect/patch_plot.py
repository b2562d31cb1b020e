"""The recovery grid of :class:`~clearlm.inspect.patching.PatchResult` as a heat map (matplotlib,
Agg): hook points down, positions across, blue where patching brings the clean answer back (1),
white where it changes nothing (0), red where it pushes further towards the wrong answer.

Returns the PNG bytes and the (P, Q) array drawn, read back from the image, as
:mod:`clearlm.inspect.plots` does, so a test can check the picture shows the grid.
"""

from __future__ import annotations

import io
import warnings

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from clearlm.inspect.patching import PatchResult  # noqa: E402

MAX_ANNOTATED = 400  # cells; beyond this the numbers would not fit in them


def _show(s: str) -> str:
    """A token as a label: whitespace made visible (␣ ↵), at most 12 characters."""
    s = s.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    return s if len(s) <= 12 else s[:11] + "…"


def recovery_png(r: PatchResult) -> tuple[bytes, np.ndarray]:
    """Draw ``r.recovery`` (P, Q) with a diverging scale clipped to [−1, 1].

    Column labels are the clean tokens, with ``→ corrupted`` where the prompts differ; each cell
    shows its value when the grid has at most MAX_ANNOTATED cells.
    """
    grid = r.recovery.numpy()  # (P, Q) float32
    P, Q = grid.shape
    cols = []
    for p in r.positions:
        a, b = _show(r.clean_tokens[p]), _show(r.corrupted_tokens[p])
        cols.append(f"{p} {a}" if a == b else f"{p} {a}→{b}")
    with plt.rc_context({"font.family": ["DejaVu Sans"]}):
        fig, ax = plt.subplots(figsize=(1.6 + 0.62 * Q, 1.2 + 0.3 * P))
        im = ax.imshow(grid, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="none")
        ax.set_xticks(range(Q), cols, rotation=50, ha="right", fontsize=8)
        ax.set_yticks(range(P), r.points, fontsize=8)
        if P * Q <= MAX_ANNOTATED:
            for i in range(P):
                for j in range(Q):
                    v = round(float(grid[i, j]), 2) + 0.0  # + 0.0: −0.001 shows as 0.00
                    ink = "white" if abs(v) > 0.6 else "#1d2430"
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6.5, color=ink)
        ax.set_title(
            f"patched recovery of logit[{_show(r.answer)}] − logit[{_show(r.wrong)}]\n"
            f"clean {r.clean_diff:.2f} · corrupted {r.corrupted_diff:.2f}",
            fontsize=9,
        )
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02).ax.tick_params(labelsize=7)
        drawn = np.asarray(im.get_array())
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"Glyph \d+ .* missing from", UserWarning)
            fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
    return buf.getvalue(), drawn
