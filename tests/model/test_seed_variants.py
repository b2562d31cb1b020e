"""The seeds' worked examples and formulas (../shared/seeds/README.md), run through the real layer
code: LayerNorm, head concatenation, ReLU and the FFN, sinusoidal encodings (both layouts),
post-norm against pre-norm blocks, tied against separate output projections, and the output
projection + softmax example. Expected numbers are the README's corrected float64 values."""

from __future__ import annotations

import math

import pytest
import torch

from clearlm.config import ModelConfig
from clearlm.model.attention import Attention
from clearlm.model.block import Block
from clearlm.model.ffn import ACTIVATIONS, MLP
from clearlm.model.norms import LayerNorm
from clearlm.model.positions import sinusoidal_table
from clearlm.model.transformer import Transformer
from clearlm.sampling.chain import greedy, softmax

Z = [0.031, 0.111, -0.08, 1.231]  # examples 1 and 2


def config(**overrides) -> ModelConfig:
    """A small LayerNorm/MLP config; each test overrides what it needs."""
    base = dict(
        architecture="test",
        vocab_size=5,
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
        ffn="mlp",
        activation="relu",
        attn_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
    )
    return ModelConfig(**{**base, **overrides})


# --- example 2: LayerNorm ----------------------------------------------------------------------


def test_layernorm_example_2():
    """μ = 0.32325, σ² = 0.27927019 (population variance), ε = 1e-5, γ = 1, β = 0."""
    z = torch.tensor(Z, dtype=torch.float64)
    assert z.mean().item() == pytest.approx(0.32325, abs=1e-12)
    assert z.var(unbiased=False).item() == pytest.approx(0.27927019, abs=1e-8)
    ln = LayerNorm(4, eps=1e-5)
    out = ln(torch.tensor(Z))
    expected = torch.tensor([-0.553012, -0.401631, -0.763052, 1.717696])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_layernorm_gamma_beta():
    """LN(z) = γ·(z − μ)/√(σ² + ε) + β, with γ and β other than 1 and 0."""
    ln = LayerNorm(4, eps=1e-5)
    with torch.no_grad():
        ln.weight.copy_(torch.tensor([2.0, -1.0, 0.5, 1.0]))
        ln.bias.copy_(torch.tensor([0.1, 0.2, -0.3, 0.0]))
    z = torch.tensor(Z, dtype=torch.float64)
    mu, var = z.mean(), z.var(unbiased=False)
    expected = ln.weight.double() * (z - mu) / torch.sqrt(var + 1e-5) + ln.bias.double()
    torch.testing.assert_close(ln(z.float()).double(), expected, atol=1e-6, rtol=0)


# --- example 1: heads concatenated -------------------------------------------------------------


def test_two_heads_concatenated_example_1():
    """Two heads of width 2 give [0.031, 0.111] and [-0.08, 1.231]; the attention module
    concatenates them to [0.031, 0.111, -0.08, 1.231] before o_proj.

    With one token, softmax over its single key is 1, so each head's output is its value vector:
    v_proj is the identity, so head 0 sees x[0:2] and head 1 sees x[2:4]. A hook on o_proj's
    input reads the concatenation itself; o_proj is random, so its output is checked too.
    """
    attn = Attention(config(), layer_idx=0)
    with torch.no_grad():
        attn.v_proj.weight.copy_(torch.eye(4))
        attn.v_proj.bias.zero_()
    seen = []
    attn.o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    x = torch.tensor([[Z]])  # (B=1, T=1, D=4)
    out = attn(x, None, torch.tensor([0]), None)
    concat = seen[0][0, 0]
    torch.testing.assert_close(concat, torch.tensor(Z))
    torch.testing.assert_close(out[0, 0], attn.o_proj(torch.tensor(Z)))


# --- example 3: ReLU and the FFN ---------------------------------------------------------------

RELU_IN = [0.31, -0.85, 0.42, -1.20, 0.55, 0.08, -0.63, 0.97]
RELU_OUT = [0.31, 0.0, 0.42, 0.0, 0.55, 0.08, 0.0, 0.97]


def test_relu_example_3():
    torch.testing.assert_close(ACTIVATIONS["relu"](torch.tensor(RELU_IN)), torch.tensor(RELU_OUT))


def test_relu_example_3_through_the_mlp():
    """FFN(z) = W2·ReLU(W1·z + b1) + b2 with W1 = W2 = I and zero biases is ReLU itself."""
    mlp = MLP(config(d_model=8, d_ff=8))
    with torch.no_grad():
        for lin in (mlp.up_proj, mlp.down_proj):
            lin.weight.copy_(torch.eye(8))
            lin.bias.zero_()
    torch.testing.assert_close(mlp(torch.tensor(RELU_IN)), torch.tensor(RELU_OUT))


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_ffn_formula(activation):
    """FFN(z) = W2·act(W1·z + b1) + b2 (Vaswani et al. 2017, eq. 2), act as named."""
    torch.manual_seed(0)
    mlp = MLP(config(activation=activation))
    z = torch.randn(3, 4)
    h = z @ mlp.up_proj.weight.T + mlp.up_proj.bias  # (3, F)
    if activation == "relu":
        a = torch.clamp(h, min=0)
    elif activation == "gelu":  # x·Φ(x)
        a = h * 0.5 * (1 + torch.erf(h / math.sqrt(2)))
    else:  # GPT-2's tanh approximation
        a = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    expected = a @ mlp.down_proj.weight.T + mlp.down_proj.bias
    torch.testing.assert_close(mlp(z), expected, atol=1e-6, rtol=1e-5)


# --- stage 1: sinusoidal encodings -------------------------------------------------------------


def test_sinusoidal_vaswani_hand_computed():
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)); for d = 4 the
    two frequencies are 1 and 10000^(-1/2) = 1/100."""
    pe = sinusoidal_table(3, 4, "vaswani")
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    p1 = [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]
    assert p1 == pytest.approx([0.841471, 0.540302, 0.00999983, 0.99995], abs=1e-6)
    torch.testing.assert_close(pe[1], torch.tensor(p1))
    p2 = [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)]
    assert p2 == pytest.approx([0.909297, -0.416147, 0.0199987, 0.9998], abs=1e-6)
    torch.testing.assert_close(pe[2], torch.tensor(p2))


def test_sinusoidal_vaswani_formula_everywhere():
    d, n = 16, 50
    pe = sinusoidal_table(n, d, "vaswani")
    for p in range(n):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=2e-5)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=2e-5)


def test_sinusoidal_fairseq_layout():
    """fairseq/XGLM: all sines, then all cosines, with frequencies ω_j = 10000^(-j/(d/2 - 1)).

    Interleaving its two halves column by column gives the original (sin, cos) pair layout, with
    ω_j in place of Vaswani's 10000^(-2j/d); the first frequency (1) is the same in both.
    """
    d, n, h = 8, 20, 4
    fs = sinusoidal_table(n, d, "fairseq")
    assert fs[1].tolist() == pytest.approx(
        [math.sin(1 / 10000 ** (j / (h - 1))) for j in range(h)]
        + [math.cos(1 / 10000 ** (j / (h - 1))) for j in range(h)],
        abs=1e-6,
    )
    interleaved = torch.stack([fs[:, :h], fs[:, h:]], dim=-1).reshape(n, d)  # (P, d)
    p = torch.arange(n, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(h, dtype=torch.float64) / (h - 1))
    expected = torch.stack([torch.sin(p * omega), torch.cos(p * omega)], dim=-1).reshape(n, d)
    torch.testing.assert_close(interleaved.double(), expected, atol=1e-5, rtol=0)
    vaswani = sinusoidal_table(n, d, "vaswani")
    torch.testing.assert_close(interleaved[:, :2], vaswani[:, :2])  # ω_0 = 1 in both


def test_embedding_plus_sinusoid_with_offset():
    """H0 = Embedding(token)·scale + PE(p + offset), as XGLM lays it out (offset 2, scale √D)."""
    cfg = config(position="sinusoidal", position_offset=2, embed_scale=2.0)
    model = Transformer(cfg)
    tokens = torch.tensor([[3, 1, 4]])
    h0 = model.embed(tokens, torch.arange(3))
    table = sinusoidal_table(16 + 2, 4, "fairseq")
    expected = model.embed_tokens.weight[tokens[0]] * 2.0 + table[2:5]
    torch.testing.assert_close(h0[0], expected)


# --- stage 3: post-norm vs pre-norm ------------------------------------------------------------


def perturbed_block(kind: str) -> Block:
    torch.manual_seed(0)
    block = Block(config(block=kind), 0)
    with torch.no_grad():
        for name, p in block.named_parameters():
            if "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.2)  # γ ≠ 1, β ≠ 0
    return block.eval()


@pytest.mark.parametrize("kind", ["pre", "post"])
def test_block_order(kind):
    """post (the seeds' formulas, the original Transformer): Z = LN1(H + Attn(H)),
    out = LN2(Z + FFN(Z)). pre (GPT-2 onward): Z = H + Attn(LN1(H)), out = Z + FFN(LN2(Z)).
    Computed here from the block's own sublayers and compared with its forward."""
    block = perturbed_block(kind)
    torch.manual_seed(1)
    H = torch.randn(2, 5, 4)  # (B, T, D)
    pos = torch.arange(5)
    ln1, ln2 = block.input_layernorm, block.post_attention_layernorm

    def attn(x: torch.Tensor) -> torch.Tensor:
        return block.self_attn(x, None, pos, None)

    with torch.no_grad():
        if kind == "post":
            Z = ln1(H + attn(H))
            expected = ln2(Z + block.mlp(Z))
        else:
            Z = H + attn(ln1(H))
            expected = Z + block.mlp(ln2(Z))
        got = block(H, None, pos, None)
    torch.testing.assert_close(got, expected)
    if kind == "post":  # a post-norm output is LayerNorm'd at every position
        normed = (got - ln2.bias) / ln2.weight  # undo γ, β: zero mean, unit variance
        torch.testing.assert_close(normed.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)


def test_pre_and_post_norm_differ():
    """Same weights, different order: the outputs differ."""
    pre, post = perturbed_block("pre"), perturbed_block("post")
    post.load_state_dict(pre.state_dict())
    H = torch.randn(1, 4, 4)
    with torch.no_grad():
        a, b = pre(H, None, torch.arange(4), None), post(H, None, torch.arange(4), None)
    assert (a - b).abs().max() > 1e-2


# --- stage 4: output projection ----------------------------------------------------------------


def test_tied_output_projection_shares_the_embedding():
    """Weight tying (Press & Wolf 2017): logits = H_final · Eᵀ with E the embedding matrix."""
    tied = Transformer(config(tie_word_embeddings=True, n_layers=0))
    separate = Transformer(config(tie_word_embeddings=False, n_layers=0))
    assert tied.lm_head.weight is tied.embed_tokens.weight
    assert separate.lm_head.weight is not separate.embed_tokens.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_separate = sum(p.numel() for p in separate.parameters())
    assert n_separate - n_tied == 5 * 4  # one V × D matrix fewer
    with torch.no_grad():
        tied.embed_tokens.weight[2] += 1.0  # the head sees the change
    torch.testing.assert_close(tied.lm_head.weight[2], tied.embed_tokens.weight[2])


WORDS = ["。", "，", "但是", "所以", "呢"]
W = [  # (D=4, V=5): one column per word
    [0.9, -0.2, 0.1, 0.3, -0.5],
    [0.4, 0.7, -0.3, 0.1, 0.2],
    [-0.1, 0.5, 0.8, -0.4, 0.3],
    [0.2, -0.6, 0.2, 0.9, 0.1],
]


def test_output_projection_example_4():
    """h = [0.15, -0.32, 0.48, 0.21] through the Transformer's lm_head (weight (V, D) = Wᵀ):
    logits h·W = [0.001, -0.140, 0.537, 0.010, 0.026], softmax [0.178190, 0.154756, 0.304554,
    0.179800, 0.182700], greedy "但是". A 0-layer model with no final norm makes the last hidden
    state the embedding of token 0, which is set to h."""
    model = Transformer(config(n_layers=0, final_norm=False, position="rope"))
    with torch.no_grad():
        model.embed_tokens.weight[0] = torch.tensor([0.15, -0.32, 0.48, 0.21])
        model.lm_head.weight.copy_(torch.tensor(W).T)
        logits = model(torch.tensor([[0]]))[0, 0]  # (V,)
    expected = torch.tensor([0.001, -0.140, 0.537, 0.010, 0.026])
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)
    probs = softmax(logits)
    torch.testing.assert_close(
        probs, torch.tensor([0.178190, 0.154756, 0.304554, 0.179800, 0.182700]), atol=1e-6, rtol=0
    )
    assert WORDS[int(greedy(logits))] == "但是"
