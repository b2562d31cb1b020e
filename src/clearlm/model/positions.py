"""Position information (seed stage 1): learned tables, sinusoids, and rotary embeddings."""

from __future__ import annotations

import math

import torch
from torch import nn

from clearlm.config import RopeScaling


def sinusoidal_table(n_positions: int, dim: int, layout: str = "vaswani") -> torch.Tensor:
    """Fixed sinusoidal position encodings, (n_positions, dim) float32.

    layout "vaswani" is the original formula (Vaswani et al. 2017, §3.5):
        PE(p, 2i) = sin(p / 10000^(2i/d)),  PE(p, 2i+1) = cos(p / 10000^(2i/d)).
    layout "fairseq" is what fairseq, and so XGLM, use: all sines then all cosines, with
    frequencies 10000^(-i/(d/2 - 1)) (transformers' XGLMSinusoidalPositionalEmbedding).
    """
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]  # (P, 1)
    half = dim // 2
    if layout == "vaswani":
        inv = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * -(math.log(10000.0) / dim))
        table = torch.zeros(n_positions, dim)
        table[:, 0::2] = torch.sin(pos * inv)  # even dimensions
        table[:, 1::2] = torch.cos(pos * inv)  # odd dimensions
        return table
    if layout == "fairseq":
        inv = torch.exp(
            torch.arange(half, dtype=torch.int64).float() * -(math.log(10000) / (half - 1))
        )
        angles = pos * inv[None, :]  # (P, d/2)
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # (P, d)
        if dim % 2 == 1:
            table = torch.cat([table, torch.zeros(n_positions, 1)], dim=1)
        return table
    raise ValueError(f"unknown sinusoidal layout {layout!r}")


def rope_inv_freq(
    rope_dim: int, base: float, scaling: RopeScaling | None, seq_len: int
) -> torch.Tensor:
    """RoPE inverse frequencies θ_j = base^(-2j/d), j < d/2, after any context scaling: (d/2,).

    Scalings follow transformers' modeling_rope_utils: "linear" divides every θ_j by the
    factor; "dynamic" (NTK) grows the base once seq_len passes the original context;
    "llama3" divides low frequencies by the factor, keeps high ones, and blends in between;
    "factors" divides each θ_j by its own factor (a GGUF's rope_freqs tensor).
    """
    exponents = torch.arange(0, rope_dim, 2, dtype=torch.int64).float() / rope_dim
    if scaling is not None and scaling.kind == "dynamic":
        orig = scaling.original_context
        seq_len = max(seq_len, orig)
        base = base * ((scaling.factor * seq_len / orig) - (scaling.factor - 1)) ** (
            rope_dim / (rope_dim - 2)
        )
    inv_freq = 1.0 / (base**exponents)
    if scaling is None or scaling.kind == "dynamic":
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "yarn":
        return yarn_inv_freq(inv_freq, rope_dim, base, scaling)
    if scaling.kind == "factors":  # llama.cpp: θ_j / freq_factors[j] (ggml rope_yarn, ggml.c)
        return inv_freq / torch.tensor(scaling.freq_factors, dtype=torch.float32)  # (d/2,)
    # llama3: wavelengths longer than original_context / low_freq_factor are stretched fully,
    # shorter than original_context / high_freq_factor are kept, the band between is blended.
    orig, f = scaling.original_context, scaling.factor
    low_wl, high_wl = orig / scaling.low_freq_factor, orig / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wl, inv_freq / f, inv_freq)
    smooth = (orig / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / f + smooth * scaled
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, blended, scaled)


def yarn_inv_freq(
    inv_freq: torch.Tensor, rope_dim: int, base: float, scaling: RopeScaling
) -> torch.Tensor:
    """YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension", §3.2 "NTK-by-parts"),
    as transformers' _compute_yarn_parameters and llama.cpp's ggml_rope_yarn_corr_dims compute it.

    Pair j makes original_context · θ_j / 2π turns over the trained context. Pairs making more
    than beta_fast turns keep θ_j (extrapolate), fewer than beta_slow take θ_j / factor
    (interpolate), and a linear ramp over the pair index blends the pairs in between.
    """

    def pair_for_turns(turns: float) -> float:  # the j at which θ_j makes `turns` turns
        orig = scaling.original_context
        return rope_dim * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_for_turns(scaling.beta_fast), pair_for_turns(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rope_dim - 1)
    if low == high:
        high += 0.001  # transformers: avoids dividing by zero
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: original frequency, 0: interpolated
    return inv_freq / scaling.factor * (1 - keep) + inv_freq * keep


class RotaryEmbedding(nn.Module):
    """Rotary position embedding tables (Su et al. 2021, "RoFormer", eq. 34).

    Position p rotates each pair of a head's dimensions by the angle p · θ_j. We pair dimension
    j with j + d/2 (the "rotate_half" layout of transformers and Meta's Llama) rather than 2j
    with 2j+1 (llama.cpp's layout); llama GGUF Q/K rows are un-permuted at load time
    (loading/gguf.py) so both give the same numbers.

    The tables are cos(p·θ) and ``sin_rot``, sin(p·θ) with its first half negated, the form
    :func:`apply_rope` multiplies by. Static scalings keep them, (P, d) float32, for the first
    P positions: P starts
    at min(max_positions, TABLE_START) and doubles (up to max_positions) when a forward pass
    needs a later position, so a file claiming a huge context allocates only what runs use.
    Each row depends only on its position, so the table size does not change any value.
    "dynamic" depends on the sequence length, so it computes them per call.
    """

    # positions: 0.25 MiB per table at d = 64 (Gemma 3's d = 256: 1 MiB, four tables); 32768
    # held 128 MiB of tables for Gemma 3 270M, half its packed weights, before a token was seen
    # (4096: 16 MiB). new_cache reserves what its cache needs, so a step never grows them.
    TABLE_START = 1024

    def __init__(
        self, rope_dim: int, base: float, max_positions: int, scaling: RopeScaling | None = None
    ) -> None:
        super().__init__()
        self.rope_dim, self.base, self.scaling = rope_dim, base, scaling
        self.max_positions = max_positions
        self.dynamic = scaling is not None and scaling.kind == "dynamic"
        n = min(max_positions, self.TABLE_START)
        cos, sin_rot = self._tables(torch.arange(n), max_positions)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin_rot", sin_rot, persistent=False)

    def _tables(self, positions: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin_rot) of the positions: each (..., T, d) float32."""
        inv_freq = rope_inv_freq(self.rope_dim, self.base, self.scaling, seq_len)
        inv_freq = inv_freq.to(positions.device)  # (d/2,): the tables live with the positions
        freqs = positions.float()[..., None] * inv_freq  # (..., T, d/2): angle p·θ_j
        emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, d): same angle for j and j + d/2
        cos, sin = emb.cos(), emb.sin()
        if self.scaling is not None and self.scaling.kind == "yarn":
            # YaRN's attention temperature, applied to q and k alike (transformers'
            # attention_scaling; llama.cpp's mscale).
            a = self.scaling.attention_factor
            cos, sin = cos * a, sin * a
        half = sin.shape[-1] // 2
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # sin_rot

    def _grow(self, need: int) -> None:
        """Rebuild the tables to cover positions < need (doubling, capped at max_positions)."""
        n = len(self.cos)
        while n < need:
            n *= 2
        n = min(max(n, need), self.max_positions)
        device = self.cos.device
        self.cos, self.sin_rot = self._tables(torch.arange(n, device=device), self.max_positions)

    def reserve(self, n: int) -> None:
        """Grow the tables now to cover positions < n (capped at max_positions; nothing for
        "dynamic", which has none): a cache's creation calls it, so that a compiled step never
        rebuilds a buffer."""
        if not self.dynamic and n > len(self.cos) < self.max_positions:
            self._grow(n)

    def forward(
        self, positions: torch.Tensor, bound: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,) or (B, T) int64 → (cos, sin_rot), each (T, d) or (B, T, d) float32.

        bound: a Python int above every position (the caller knows it: the cache size, the
        prompt length), so the table grows without reading ``positions`` back from the device;
        None reads their maximum (a host sync: not for a decode step). "dynamic" scaling
        depends on the largest position itself and always reads it.
        """
        if self.dynamic:
            return self._tables(positions, int(positions.max()) + 1)
        if bound is None:
            bound = int(positions.max()) + 1 if positions.numel() else 0
        if bound > len(self.cos) < self.max_positions:
            self._grow(bound)
        return self.cos[positions], self.sin_rot[positions]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., d) → (..., d): [x1, x2] ↦ [-x2, x1], the 90° rotation of each (j, j + d/2) pair."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_rot: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys: x (B, n, T, Hd), cos/sin_rot (T, d), or per row (B, T, d) or
    (B, 1, T, d) → (B, n, T, Hd), x's dtype.

    x·cos + rotate_half(x)·sin is the 2-D rotation [[cos, -sin], [sin, cos]] on every pair.
    It is computed as x·cos + roll(x, d/2)·sin_rot, with sin_rot = [−sin_1, sin_2] (the table
    :class:`RotaryEmbedding` keeps): rotate_half(x) = [−x2, x1] and roll(x, d/2) = [x2, x1], so
    each product is the same float32 number (negation is exact), in four torch ops instead of
    eight (tests/model/test_decode_ops.py checks it against the formula). When d < Hd (partial
    rotary) only the first d dimensions rotate.
    """
    if cos.dtype != x.dtype:
        cos, sin_rot = cos.to(x.dtype), sin_rot.to(x.dtype)
    if cos.dim() == 3:  # per-row positions: broadcast over the heads
        cos, sin_rot = cos[:, None], sin_rot[:, None]  # (B, 1, T, d)
    d = cos.shape[-1]
    if d == x.shape[-1]:
        return x * cos + x.roll(d // 2, -1) * sin_rot
    rot, rest = x[..., :d], x[..., d:]
    return torch.cat((rot * cos + rot.roll(d // 2, -1) * sin_rot, rest), dim=-1)
