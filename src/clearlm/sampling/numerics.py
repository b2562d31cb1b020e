"""Keeping the sampling arithmetic finite, whatever the logits' dtype and the settings' size.

The filters of :mod:`clearlm.sampling.filters` compute in float32 (as Hugging Face ``generate``
casts the scores to float32 before its processors): a float16 logit of 11 divided by T = 1e-4 is
110625, past float16's largest value 65504, but well inside float32's. Float32 has limits too
(a bfloat16 logit may be 3e38; T may be 1e-40 or 1e300), so the two steps that scale logits,
temperature and repetition penalty, check their result and, only when it left the float range,
compute the same distribution another way: in float64, shifted so that each row's maximum is 0.
A per-row shift does not change softmax (e^{z-m} / Σ e^{z_j-m} = e^z / Σ e^{z_j}), and with every
entry <= 0 nothing can overflow: the top token is 0 and a token e^{-10^40} times less likely is
-inf, i.e. probability 0, which float32 could not tell apart anyway.

:func:`check_logits` is the one place that refuses logits no distribution can be made from.
"""

from __future__ import annotations

import torch
from torch import Tensor

from clearlm.errors import SamplingError


def check_logits(logits: Tensor) -> None:
    """Raise SamplingError unless every row of ``(..., V)`` logits has a possible token.

    Valid rows hold finite values and ``-inf`` (an impossible token), with at least one finite
    value. A NaN or ``+inf`` (e.g. a model that overflowed in float16) or a row where every entry
    is ``-inf`` (every token banned, e.g. by a hook) has no softmax, so nothing can be drawn from
    it: a typed error says so rather than a NaN distribution or a silent pick of token 0.
    """
    row_max = logits.amax(dim=-1)  # (...,): NaN if the row has one, +inf, or -inf if all are
    if bool(torch.isfinite(row_max).all()):  # one reduction and one sync on the common path
        return
    has_bad = bool((torch.isnan(row_max) | torch.isposinf(row_max)).any())
    if has_bad:
        half = logits.dtype in (torch.float16, torch.bfloat16)
        hint = (
            f"{str(logits.dtype).removeprefix('torch.')} can overflow: try --dtype float32"
            if half
            else "check the model file's weights, or what a hook returned"
        )
        raise SamplingError(
            "the logits contain NaN or +inf, so they give no probability distribution; " + hint
        )
    raise SamplingError(
        "every logit of a row is -inf, so no token is possible; "
        "a filter or hook removed every token"
    )


def left_range(z: Tensor, out: Tensor) -> bool:
    """True when ``out`` (computed from ``z``) lost a row: a row of ``z`` with a finite maximum
    whose result's maximum is NaN or ±inf (an overflow, an underflow of the whole row to -inf,
    or inf/inf). Both ``(..., V)``."""
    lost = torch.isfinite(z.amax(dim=-1)) & ~torch.isfinite(out.amax(dim=-1))  # (...,)
    return bool(lost.any())


def _row_max(z: Tensor) -> Tensor:
    """Each row's maximum ``(..., 1)``, with 0 for a row that has none (all -inf), so that
    subtracting it leaves such a row all -inf instead of NaN."""
    m = z.amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def shifted_temperature(z: Tensor, temperature: float) -> Tensor:
    """(z - max z) / T in float64, back to float32: softmax equals softmax(z / T).

    ``z`` ``(..., V)`` float32 -> ``(..., V)`` float32; every entry is <= 0 or -inf and each row
    with a finite entry keeps its maximum at 0, for any T in (0, inf) a double can hold.
    """
    z64 = z.to(torch.float64)
    return ((z64 - _row_max(z64)) / temperature).to(torch.float32)


def shifted_penalty(z: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """The repetition penalty in float64, shifted so each row's maximum is 0, back to float32.

    ``z`` ``(..., V)`` float32, ``seen`` ``(..., V)`` bool. Raises SamplingError when even
    float64 overflows (logit / penalty > 1.8e308: a penalty below 1e-308 on a logit of 1).
    """
    z64 = z.to(torch.float64)
    out = torch.where(seen, torch.where(z64 < 0, z64 * penalty, z64 / penalty), z64)
    if left_range(z64, out):
        raise SamplingError(
            f"repetition_penalty {penalty!r} scales the logits past the float range; "
            "use a penalty nearer 1"
        )
    return (out - _row_max(out)).to(torch.float32)
