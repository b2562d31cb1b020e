"""The seeds' worked examples, computed by the real layer code (``clearlm walkthrough``).

The two source documents (``../shared/seeds/``) walk one forward pass through five stages with
small hand-computed examples. Each function here rebuilds one example with the modules and
functions clearlm runs real models with (``clearlm.model.*``, ``clearlm.sampling.chain``), not
re-typed formulas, and returns plain data; ``clearlm.cli.walkthrough`` prints it. Where the
documents' printed arithmetic is slightly off, the example carries their numbers too
(``document_*``), so the two can be shown side by side. The right values are the seeds
README's, computed in float64; the tests check them here, not in the printed output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from clearlm.config import ModelConfig
from clearlm.inspect.sampling_explain import SamplingExplanation, explain_sampling
from clearlm.model.attention import Attention, attention_mask
from clearlm.model.ffn import ACTIVATIONS, MLP
from clearlm.model.norms import LayerNorm
from clearlm.model.positions import sinusoidal_table
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import SamplingParams, greedy, softmax

Vector = tuple[float, ...]

HEADS = ((0.031, 0.111), (-0.08, 1.231))  # example 1: the two heads' outputs
RELU_IN = (0.31, -0.85, 0.42, -1.20, 0.55, 0.08, -0.63, 0.97)  # example 3, d_ff = 8
WORDS = ("。", "，", "但是", "所以", "呢")  # example 4's vocabulary
H_FINAL = (0.15, -0.32, 0.48, 0.21)  # example 4: the last token's final hidden state
W_OUT = (  # example 4: (D=4, V=5), one column per word
    (0.9, -0.2, 0.1, 0.3, -0.5),
    (0.4, 0.7, -0.3, 0.1, 0.2),
    (-0.1, 0.5, 0.8, -0.4, 0.3),
    (0.2, -0.6, 0.2, 0.9, 0.1),
)
DOCUMENT_LOGITS = (-0.006, -0.156, 0.549, 0.086, 0.024)  # as printed in 000_*.txt


def _config(**overrides: object) -> ModelConfig:
    """A tiny post-norm, LayerNorm + ReLU-MLP config: the seeds' original-Transformer choices."""
    base: dict[str, object] = dict(
        architecture="seeds",
        vocab_size=len(WORDS),
        d_model=4,
        n_layers=1,
        n_heads=2,
        n_kv_heads=2,
        head_dim=2,
        d_ff=8,
        norm_eps=1e-5,
        context_length=16,
        tie_word_embeddings=False,
        position="learned",
        norm="layer",
        block="post",
        ffn="mlp",
        activation="relu",
        attn_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
    )
    return ModelConfig(**{**base, **overrides})  # type: ignore[arg-type]


def _vec(t: torch.Tensor) -> Vector:
    return tuple(float(v) for v in t.flatten())


# --- stage 1: positions ------------------------------------------------------------------------


def sinusoidal_rows(n_positions: int = 4, dim: int = 4) -> tuple[Vector, ...]:
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)) for p < n_positions
    (Vaswani et al. 2017, §3.5), from :func:`sinusoidal_table`; one row per position."""
    return tuple(_vec(row) for row in sinusoidal_table(n_positions, dim, "vaswani"))


# --- stage 2: attention ------------------------------------------------------------------------


def causal_mask(n_tokens: int = 4) -> tuple[tuple[bool, ...], ...]:
    """The causal mask of a fresh prompt of ``n_tokens``: row t (query), column s (key), True
    where t may attend to s (s ≤ t). From :func:`attention_mask`, the mask attention uses."""
    mask = attention_mask(torch.arange(n_tokens), n_tokens)  # (T, S) bool
    assert mask is not None  # only a single decode token gets None
    return tuple(tuple(bool(v) for v in row) for row in mask)


@dataclass(frozen=True)
class HeadsExample:
    """Example 1: two heads of width 2, concatenated back to d_model = 4 before o_proj."""

    heads: tuple[Vector, ...]
    concat: Vector


def heads_example() -> HeadsExample:
    """Run :class:`Attention` (H = 2, Hd = 2) on one token and read the heads' concatenation.

    With one token each head's softmax has a single key, weight 1, so each head outputs its value
    vector. v_proj is the identity, so head h's value is x[2h : 2h + 2]: x = the two heads'
    outputs side by side makes head 0 output [0.031, 0.111] and head 1 [-0.08, 1.231]. o_proj is
    the identity too, so the module's output is the concatenation itself.
    """
    attn = Attention(_config(), layer_idx=0).eval()
    with torch.no_grad():
        for lin in (attn.v_proj, attn.o_proj):
            lin.weight.copy_(torch.eye(4))
            lin.bias.zero_()
        x = torch.tensor([[[v for head in HEADS for v in head]]])  # (B=1, T=1, D=4)
        out = attn(x, None, torch.tensor([0]), None)[0, 0]  # (D,) = (H·Hd,)
    return HeadsExample(heads=tuple(_vec(h) for h in out.view(2, 2)), concat=_vec(out))


# --- stage 3: LayerNorm and the FFN ------------------------------------------------------------


@dataclass(frozen=True)
class LayerNormExample:
    """Example 2: LN(z) = γ·(z − μ)/√(σ² + ε) + β with γ = 1, β = 0, ε = 1e-5."""

    z: Vector
    mean: float
    variance: float  # population variance (divide by 4), as LayerNorm uses
    eps: float
    std: float  # √(σ² + ε), the divisor
    output: Vector
    document_variance: float = 0.27925
    document_std: float = 0.5284411  # √0.27925: the document leaves out ε
    document_output: Vector = (-0.55, -0.402, -0.763, 1.718)


def layernorm_example() -> LayerNormExample:
    """Normalise example 1's concatenation with :class:`LayerNorm` (γ = 1, β = 0 as initialised).

    μ and σ² are shown in float64 (the module computes them internally in float32).
    """
    eps = 1e-5
    z = torch.tensor([v for head in HEADS for v in head], dtype=torch.float64)
    mu, var = float(z.mean()), float(z.var(unbiased=False))
    with torch.no_grad():
        out = LayerNorm(4, eps=eps)(z.float())
    return LayerNormExample(
        z=_vec(z), mean=mu, variance=var, eps=eps, std=math.sqrt(var + eps), output=_vec(out)
    )


@dataclass(frozen=True)
class ReluExample:
    """Example 3: ReLU zeroes the negative entries of the FFN's d_ff-wide hidden vector."""

    hidden: Vector
    relu: Vector  # ACTIVATIONS["relu"] alone
    ffn: Vector  # the MLP with W1 = W2 = I and zero biases: FFN(z) = ReLU(z)


def relu_example() -> ReluExample:
    """ReLU of [0.31, -0.85, 0.42, -1.20, 0.55, 0.08, -0.63, 0.97], by the activation table and
    through :class:`MLP` (FFN(z) = W2·ReLU(W1·z + b1) + b2, Vaswani et al. 2017 eq. 2)."""
    x = torch.tensor(RELU_IN)
    mlp = MLP(_config(d_model=8, d_ff=8))
    with torch.no_grad():
        for lin in (mlp.up_proj, mlp.down_proj):
            lin.weight.copy_(torch.eye(8))
            lin.bias.zero_()
        ffn = mlp(x)
    return ReluExample(hidden=RELU_IN, relu=_vec(ACTIVATIONS["relu"](x)), ffn=_vec(ffn))


# --- stages 4 and 5: output projection, softmax, greedy ----------------------------------------


@dataclass(frozen=True)
class OutputExample:
    """Example 4: logits = h·W (one column per word), softmax, greedy pick."""

    words: tuple[str, ...]
    h: Vector
    W: tuple[Vector, ...]  # (D, V)
    logits: Vector
    probs: Vector
    greedy_id: int
    document_logits: Vector
    document_probs: Vector  # softmax of the document's logits
    document_greedy_id: int

    @property
    def greedy_word(self) -> str:
        return self.words[self.greedy_id]


def output_example() -> OutputExample:
    """Project h = [0.15, -0.32, 0.48, 0.21] through a :class:`Transformer`'s ``lm_head``.

    A 0-layer model with no final norm and RoPE positions (nothing added at embedding) makes the
    last hidden state the embedding of token 0, which is set to h; ``lm_head.weight`` (V, D) is
    Wᵀ. Softmax and greedy are :func:`clearlm.sampling.chain.softmax` and ``greedy``.
    """
    model = Transformer(_config(n_layers=0, position="rope", final_norm=False)).eval()
    with torch.no_grad():
        model.embed_tokens.weight[0] = torch.tensor(H_FINAL)
        model.lm_head.weight.copy_(torch.tensor(W_OUT).T)  # (V, D)
        logits = model(torch.tensor([[0]]))[0, 0]  # (V,)
    doc = torch.tensor(DOCUMENT_LOGITS)
    return OutputExample(
        words=WORDS,
        h=H_FINAL,
        W=W_OUT,
        logits=_vec(logits),
        probs=_vec(softmax(logits)),
        greedy_id=int(greedy(logits)),
        document_logits=DOCUMENT_LOGITS,
        document_probs=_vec(softmax(doc)),
        document_greedy_id=int(greedy(doc)),
    )


@dataclass(frozen=True)
class SamplingScenario:
    """One sampling setting applied to example 4's logits, explained step by step."""

    label: str
    params: SamplingParams
    explanation: SamplingExplanation  # with the scenario's seed (0)
    draws: tuple[int, ...]  # the token picked with seeds 0, 1, …: sampling is random, greedy not

    def draw_probs(self) -> dict[int, float]:
        """token id → the probability of being picked: the renormalised survivors of the chain,
        or for greedy (temperature 0) probability 1 on the argmax and 0 elsewhere."""
        if self.params.temperature == 0:
            return {self.explanation.token: 1.0}
        return dict(self.explanation.steps[-1].top)


SCENARIOS: tuple[tuple[str, SamplingParams], ...] = (
    ("greedy", SamplingParams(temperature=0)),
    ("plain sampling", SamplingParams(seed=0)),
    ("temperature 0.5", SamplingParams(temperature=0.5, seed=0)),
    ("temperature 2", SamplingParams(temperature=2.0, seed=0)),
    ("top-k 2", SamplingParams(top_k=2, seed=0)),
    ("top-p 0.5", SamplingParams(top_p=0.5, seed=0)),
    ("top-p 0.9", SamplingParams(top_p=0.9, seed=0)),
)


def sampling_scenarios(
    logits: Vector | None = None, n_draws: int = 10
) -> tuple[SamplingScenario, ...]:
    """What the documents' strategies (greedy, top-k, top-p, temperature) do to example 4's
    distribution (or ``logits``, (V,)): :func:`explain_sampling` for each setting in
    :data:`SCENARIOS`, then the picks of ``n_draws`` samplers seeded 0, 1, …"""
    z = torch.tensor(output_example().logits if logits is None else logits)  # (V,)
    return tuple(
        SamplingScenario(
            label,
            params,
            explain_sampling(z, None, params),
            tuple(explain_sampling(z, None, replace(params, seed=s)).token for s in range(n_draws)),
        )
        for label, params in SCENARIOS
    )
