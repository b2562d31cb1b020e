"""The picture of a :class:`~clearlm.inspect.diff.ModelDiff` (``clearlm diff --plot FILE``).

Three panels: a layer × position heat map of the residual stream's relative error (each block's
``resid_post``, log colour scale), the logit KL per position under it, and on the right each
point's largest error per layer, with the threshold. Drawn with matplotlib (Agg) in the fonts of
:mod:`clearlm.inspect.plots`; returns the PNG and the matrix drawn, so a test can check that the
picture shows the diff's own numbers.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

from clearlm.inspect.diff import THRESHOLD_POINT, ModelDiff  # noqa: E402
from clearlm.inspect.explain import show  # noqa: E402
from clearlm.inspect.plots import _FAMILIES, MAX_LABELS, _png  # noqa: E402

FLOOR = 1e-9  # errors below (0 included) are drawn at this value: a log scale has no zero


def diff_png(d: ModelDiff, title: str = "") -> tuple[bytes, np.ndarray]:
    """The heat map, KL strip and per-layer curves of ``d``.

    Returns:
        The PNG bytes and the (N, T) float64 matrix of the heat map (relative error of each
        block's resid_post, before the floor).
    """
    with plt.rc_context({"font.family": _FAMILIES}):
        return _draw(d, title)


def _draw(d: ModelDiff, title: str) -> tuple[bytes, np.ndarray]:
    grid = d.point(THRESHOLD_POINT).numpy()  # (N, T)
    n, t = grid.shape
    finite = grid[np.isfinite(grid) & (grid > 0)]
    hi = float(finite.max()) if finite.size else FLOOR * 10
    lo = max(FLOOR, float(finite.min())) if finite.size else FLOOR
    lo = min(lo, hi / 10)  # a range of at least one decade
    fig = plt.figure(figsize=(min(16.0, max(8.0, 0.16 * t + 6)), max(4.5, 0.16 * n + 2.8)),
                     layout="constrained")
    spec = fig.add_gridspec(2, 2, width_ratios=(3, 1.2), height_ratios=(5, 1))
    heat, kl = fig.add_subplot(spec[0, 0]), fig.add_subplot(spec[1, 0])
    curves = fig.add_subplot(spec[0, 1], sharey=heat)
    shown = np.clip(np.nan_to_num(grid, posinf=hi), lo, None)  # 0 drawn as the darkest
    im = heat.imshow(shown, aspect="auto", cmap="magma", norm=LogNorm(lo, hi))
    if d.first_layer is not None:  # the first block over the threshold, outlined
        heat.add_patch(plt.Rectangle((-0.5, d.first_layer - 0.5), t, 1, fill=False,
                                     ec="#00c0ff", lw=1.5))
    step = max(1, n // 24)  # at most ~24 layer labels
    heat.set_yticks(range(0, n, step), [f"L{i}" for i in range(0, n, step)], fontsize=7)
    heat.set_xticks(range(t), [""] * t)
    heat.set_ylabel("block (its residual stream out)")
    fig.suptitle(title or "B against A: relative error of the residual stream", fontsize=10)
    fig.colorbar(im, ax=curves, label="‖a − b‖ / ‖a‖ (heat map)")

    kls = np.clip(d.kl.numpy(), 0, None)
    kl.bar(range(t), kls, color="#555555", width=0.8)
    kl.set_xlim(heat.get_xlim())
    top = float(kls.max()) if kls.size else 0.0
    kl.set_yticks([0, top] if top > 0 else [0], ["0", f"{top:.1e}"] if top > 0 else ["0"],
                  fontsize=7)
    kl.set_ylabel("KL", fontsize=8)
    labels = [show(s) for s in d.text] if d.text and t <= 2 * MAX_LABELS else [""] * t
    kl.set_xticks(range(t), labels, rotation=90, fontsize=7 if t <= MAX_LABELS else 5)
    kl.set_xlabel("position (the token read there); bars: KL(P_A ‖ P_B) of the next token, nats",
                  fontsize=8)

    for j, point in enumerate(d.points):
        worst = np.clip(np.nan_to_num(d.blocks[:, j].amax(1).numpy(), posinf=hi), lo, None)
        curves.plot(worst, range(n), marker=".", ms=3, label=point,
                    lw=1.6 if point == THRESHOLD_POINT else 0.8)
    curves.axvline(d.threshold, color="#00c0ff", ls="--", lw=1, label=f"threshold {d.threshold:g}")
    curves.set_xscale("log")
    curves.tick_params(axis="y", labelleft=False)
    curves.tick_params(axis="x", labelsize=7)
    curves.set_title("per block, largest over positions", fontsize=8)
    key = fig.add_subplot(spec[1, 1])  # the curves' legend, under them
    key.axis("off")
    key.legend(*curves.get_legend_handles_labels(), fontsize=7, loc="center", ncol=2,
               frameon=False)
    return _png(fig), grid
