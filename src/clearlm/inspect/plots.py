"""Pictures of an :class:`~clearlm.inspect.explain.Explanation`, drawn with matplotlib (Agg).

Each function returns the PNG bytes and the numbers it drew, read back from the plotted
artists (the image arrays, the bar heights), so tests can check that a picture shows the traced
tensors and not something else.
"""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Callable
from typing import TypeVar

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from clearlm.inspect.explain import Explanation, show  # noqa: E402

T_ = TypeVar("T_")
MAX_LABELS = 40  # beyond this many tokens, axis labels are dropped (unreadable anyway)

# Fonts with CJK and other scripts that DejaVu Sans lacks, used as fallbacks (matplotlib ≥ 3.6
# tries each family in turn per glyph) when one is installed; missing glyphs are drawn as boxes
# and their warnings silenced, so a CJK prompt never floods stderr.
_FALLBACKS = ("Noto Sans CJK JP", "Noto Sans CJK SC", "WenQuanYi Zen Hei", "Droid Sans Fallback")
_FAMILIES = ["DejaVu Sans"] + sorted(
    {f.name for f in font_manager.fontManager.ttflist} & set(_FALLBACKS)
)


def _with_fonts(fn: Callable[[Explanation], T_]) -> Callable[[Explanation], T_]:
    """Draw with the fallback font families (text takes its font when it is created)."""

    @functools.wraps(fn)
    def wrapped(ex: Explanation) -> T_:
        with plt.rc_context({"font.family": _FAMILIES}):
            return fn(ex)

    return wrapped


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"Glyph \d+ .* missing from", UserWarning)
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _labels(ex: Explanation) -> list[str]:
    return [show(t) for t in ex.text]


@_with_fonts
def attention_png(ex: Explanation) -> tuple[bytes, dict[tuple[int, int], np.ndarray]]:
    """A layer × head grid of attention heatmaps (query rows, key columns).

    Cells above the diagonal (keys after the query) are masked by the causal mask and drawn
    grey, so the triangle shows. Returns the PNG and (layer, head) → the (T, T) matrix drawn.
    """
    labels, T = _labels(ex), len(ex.tokens)
    rows, cols = len(ex.layers), len(ex.heads)
    size = max(1.6, min(3.2, 0.32 * T + 0.8))
    fig, axes = plt.subplots(
        rows, cols, figsize=(size * cols + 1.2, size * rows + 0.8), squeeze=False
    )
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")  # masked cells: grey
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T) True where key > query
    drawn: dict[tuple[int, int], np.ndarray] = {}
    im = None
    for r, layer in enumerate(ex.layers):
        for c, head in enumerate(ex.heads):
            ax = axes[r][c]
            m = ex.patterns[layer][head].numpy()  # (T, T) query × key
            im = ax.imshow(np.ma.array(m, mask=causal), cmap=cmap, vmin=0.0, vmax=1.0)
            drawn[(layer, head)] = np.ma.filled(im.get_array(), 0.0)
            ax.set_title(f"L{layer} H{head}", fontsize=9)
            show_labels = T <= MAX_LABELS
            ax.set_xticks(range(T), labels if show_labels and r == rows - 1 else [""] * T)
            ax.set_yticks(range(T), labels if show_labels and c == 0 else [""] * T)
            ax.tick_params(axis="x", labelrotation=90, labelsize=7)
            ax.tick_params(axis="y", labelsize=7)
    fig.suptitle("Attention weights (rows: query token, columns: key token; grey: masked)")
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight")
    return _png(fig), drawn


@_with_fonts
def temperature_png(ex: Explanation) -> tuple[bytes, dict[float, np.ndarray]]:
    """Bars of the top next tokens' probabilities at each temperature in ex.temperature_probs.

    Returns the PNG and temperature → the (k,) bar heights drawn."""
    labels = [show(ex.text_of(i)) for i in ex.top_ids.tolist()]
    temps = list(ex.temperature_probs)
    k, width = len(labels), 0.8 / len(temps)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * k + 2), 4))
    drawn: dict[float, np.ndarray] = {}
    for j, t in enumerate(temps):
        x = np.arange(k) + (j - (len(temps) - 1) / 2) * width
        bars = ax.bar(x, ex.temperature_probs[t].numpy(), width, label=f"T = {t:g}")
        drawn[t] = np.array([b.get_height() for b in bars])
    ax.set_xticks(range(k), labels, rotation=45, ha="right")
    ax.set_ylabel("probability")
    ax.set_title(f"Next token after {ex.prompt!r}: softmax(logits / T)")
    ax.legend()
    return _png(fig), drawn


@_with_fonts
def lens_png(ex: Explanation) -> tuple[bytes, np.ndarray]:
    """The logit lens as a heatmap: rows are layers (0 = block 0's input), columns positions,
    colour the top token's probability, the top token written in each cell when it fits.

    Returns the PNG and the (N + 1, T) matrix drawn."""
    n_rows, T = ex.lens_probs.shape
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * T + 2), max(4.0, 0.28 * n_rows + 1.5)))
    im = ax.imshow(ex.lens_probs.numpy(), cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    drawn = np.asarray(im.get_array())
    if T <= 16 and n_rows <= 64:
        for i in range(n_rows):
            for j in range(T):
                p = float(ex.lens_probs[i, j])
                word = show(ex.text_of(int(ex.lens_ids[i, j])))[:10]
                ax.text(
                    j,
                    i,
                    word,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if p > 0.6 else "black",
                )
    ax.set_xticks(range(T), _labels(ex) if T <= MAX_LABELS else [""] * T, rotation=45, ha="right")
    ax.set_yticks(range(n_rows), ["emb"] + [f"L{i}" for i in range(n_rows - 1)], fontsize=7)
    ax.set_xlabel("position (the token read there)")
    ax.set_ylabel("residual stream after block")
    ax.set_title("Logit lens: top next-token guess at each layer and position")
    fig.colorbar(im, ax=ax, label="probability of the top token")
    return _png(fig), drawn


def all_pngs(ex: Explanation) -> dict[str, bytes]:
    """file name → PNG bytes for every picture."""
    return {
        "attention.png": attention_png(ex)[0],
        "temperature.png": temperature_png(ex)[0],
        "logit_lens.png": lens_png(ex)[0],
    }
