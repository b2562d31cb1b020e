"""The model's hyper-parameters as one frozen dataclass.

The first block of fields is what every decoder-only Transformer has. The rest name the choice
made at each stage of the seeds (``../shared/seeds/``); their defaults are Llama's, so a family
states only what differs. This module reads no file: each family maps config.json
(``clearlm.families``) and GGUF metadata (``clearlm.loading.gguf_config``) onto these fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from clearlm.errors import InvalidModelFileError, UnsupportedModelError

POSITIONS = ("rope", "learned", "sinusoidal")
NORMS = ("rms", "layer")
BLOCKS = ("pre", "post", "sandwich")
FFNS = ("gated", "mlp")
QK_NORM_SCOPES = ("head", "all")  # RMSNorm over each head's Hd values, or over all H·Hd
ACTIVATIONS = ("silu", "gelu_tanh", "gelu", "relu")
ROPE_SCALINGS = ("linear", "dynamic", "llama3", "yarn")  # the config.json rope types we run
# + "factors": per-frequency divisors, llama.cpp's rope_freqs.weight tensor (Llama 3.1+ GGUFs)
ROPE_KINDS = (*ROPE_SCALINGS, "factors")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature √(1/t) = 0.1·ln(s) + 1 (Peng et al. 2023, eq. 22)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE frequencies are stretched for contexts longer than training.

    kind: "linear" (positions ÷ factor; Chen et al. 2023), "dynamic" (NTK-aware base growth once
    the sequence passes ``original_context``; bloc97/emozilla), or "llama3" (per-band
    interpolation; Meta's Llama 3.1 reference) or "yarn" (Peng et al. 2023: a ramp between
    interpolated and original frequencies set by beta_fast/beta_slow rotations over
    ``original_context``, and cos/sin × ``attention_factor``). Formulas follow transformers'
    ``modeling_rope_utils``. "factors" divides each frequency θ_j by ``freq_factors[j]``, the
    way llama.cpp applies a GGUF's ``rope_freqs.weight`` (ggml_rope_ext's freq_factors); its
    converter bakes Llama 3's scaling into that tensor.
    """

    kind: str
    factor: float
    original_context: int = 0  # tokens; dynamic, llama3 and yarn
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn: rotations where the ramp starts (kept frequencies)
    beta_slow: float = 1.0  # yarn: rotations where it ends (interpolated frequencies)
    attention_factor: float = 1.0  # yarn: cos/sin multiplier (0.1·ln(factor) + 1 by default)
    truncate: bool = True  # yarn: round the ramp's ends outward (transformers' default)
    freq_factors: tuple[float, ...] = field(default=(), repr=False)  # factors: (d/2,)

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise UnsupportedModelError(
                f"rope scaling {self.kind!r} is not supported; supported: " + ", ".join(ROPE_KINDS)
            )

    def __str__(self) -> str:
        """What ``clearlm info`` shows: the kind and the parameters it uses."""
        if self.kind == "factors":
            return f"factors ({len(self.freq_factors)} from rope_freqs.weight)"
        extra = {
            "linear": "",
            "dynamic": f" (original {self.original_context})",
            "llama3": f" (original {self.original_context}, low {self.low_freq_factor:g}, "
            f"high {self.high_freq_factor:g})",
            "yarn": f" (original {self.original_context}, beta {self.beta_fast:g}/"
            f"{self.beta_slow:g}, attention ×{self.attention_factor:.4g})",
        }[self.kind]
        return f"{self.kind} ×{self.factor:g}{extra}"


# ModelConfig fields that are sizes or counts: positive integers.
SIZE_FIELDS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "d_ff",
    "context_length",
    "embed_dim",
    "rope_dim",
    "expert_d_ff",
)


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a decoder-only Transformer (names follow the field's usage).

    Shape letters: V vocab_size, D d_model, N n_layers, H n_heads, K n_kv_heads, Hd head_dim,
    F d_ff. Lengths are in tokens.

    Stage 1, input: ``position`` is "rope" (Su et al. 2021), "learned" (GPT-2, OPT) or
    "sinusoidal" (Vaswani et al. 2017, as fairseq/XGLM lays it out); ``position_offset`` shifts
    learned/sinusoidal indices (OPT and XGLM reserve 2 rows); ``embed_scale`` multiplies the
    token embedding (√D for Gemma and XGLM); ``embed_dim`` E ≠ D embeds tokens in E and projects
    E → D after the lookup and D → E before the output projection (OPT-350m's project_in/out).
    Stage 2, attention: ``attn_bias`` (biases on Q/K/V), ``attn_out_bias``, ``qk_norm``
    (RMSNorm on q and k: Qwen3, Gemma 3, OLMoE) over each head ("head") or over the whole
    projection (``qk_norm_scope`` "all": OLMoE), ``clip_qkv`` (q, k, v clamped to ±c: OLMoE),
    ``attn_scale`` (None: 1/√Hd),
    ``attn_softcap`` (Gemma 2), ``sliding_window`` with ``layer_types`` ("full"/"sliding" per
    layer), ``rope_local_theta`` (RoPE base of sliding layers: Gemma 3).
    Stage 3, residual + norm + FFN: ``norm`` "rms" or "layer" (LayerNorm with bias),
    ``norm_offset`` (Gemma's RMSNorm scales by 1 + w), ``block`` "pre" (GPT-2 onward), "post"
    (the original Transformer: LN(x + sublayer(x))) or "sandwich" (Gemma 2/3: norms before and
    after each sublayer), ``ffn`` "gated" (SwiGLU/GeGLU) or "mlp" (W2·act(W1·x + b1) + b2),
    ``activation``, ``mlp_bias``. Mixture of experts (model/moe.py): ``n_experts`` E > 0
    replaces the FFN of every layer not in ``dense_layers`` by a router over E gated FFNs of
    width ``expert_d_ff`` of which each token uses ``n_experts_used`` k, their weights
    renormalised to sum 1 when ``norm_topk_prob``; ``shared_expert_d_ff`` > 0 adds an expert
    every token uses, behind a sigmoid gate (Qwen2-MoE).
    Stage 4, output: ``final_norm``, ``tie_word_embeddings``, ``final_logit_softcap`` (Gemma 2).
    """

    architecture: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    norm_eps: float
    context_length: int
    tie_word_embeddings: bool
    # stage 1: input representation
    position: str = "rope"
    position_offset: int = 0
    embed_scale: float = 1.0
    embed_dim: int = 0  # 0: d_model
    rope_theta: float = 10000.0
    rope_dim: int = 0  # 0: head_dim
    rope_scaling: RopeScaling | None = None
    rope_local_theta: float | None = None
    # stage 2: attention
    attn_bias: bool = False
    attn_out_bias: bool = False
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    clip_qkv: float | None = None
    attn_scale: float | None = None
    attn_softcap: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    # stage 3: residual, norm, feed-forward
    norm: str = "rms"
    norm_offset: float = 0.0
    block: str = "pre"
    ffn: str = "gated"
    activation: str = "silu"
    mlp_bias: bool = False
    n_experts: int = 0  # 0: dense FFNs
    n_experts_used: int = 0
    expert_d_ff: int = 0  # 0: d_ff
    norm_topk_prob: bool = True
    shared_expert_d_ff: int = 0  # 0: no shared expert
    dense_layers: tuple[int, ...] = ()
    # stage 4: output
    final_norm: bool = True
    final_logit_softcap: float | None = None
    family: str = field(default="", compare=False)  # display name, e.g. "Gemma 3"

    def __post_init__(self) -> None:
        if self.rope_dim == 0:
            object.__setattr__(self, "rope_dim", self.head_dim)
        if self.embed_dim == 0:
            object.__setattr__(self, "embed_dim", self.d_model)
        if self.expert_d_ff == 0:
            object.__setattr__(self, "expert_d_ff", self.d_ff)
        if not self.layer_types:
            kind = "sliding" if self.sliding_window else "full"
            object.__setattr__(self, "layer_types", (kind,) * self.n_layers)
        for name, allowed in (
            ("position", POSITIONS),
            ("norm", NORMS),
            ("block", BLOCKS),
            ("ffn", FFNS),
            ("activation", ACTIVATIONS),
            ("qk_norm_scope", QK_NORM_SCOPES),
        ):
            if getattr(self, name) not in allowed:
                raise UnsupportedModelError(
                    f"{name} {getattr(self, name)!r} is not supported; supported: "
                    + ", ".join(allowed)
                )
        self._check_values()
        if self.n_heads % self.n_kv_heads != 0:
            raise InvalidModelFileError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if len(self.layer_types) != self.n_layers:
            raise InvalidModelFileError(
                f"layer_types has {len(self.layer_types)} entries for {self.n_layers} layers"
            )
        if "sliding" in self.layer_types and not self.sliding_window:
            raise InvalidModelFileError("sliding layers need a sliding_window size")
        self._check_experts()

    def _check_experts(self) -> None:
        """A mixture of experts routes each token to 1 ≤ k ≤ E experts; InvalidModelFileError
        naming the field otherwise."""
        if self.n_experts < 0 or self.shared_expert_d_ff < 0:
            raise InvalidModelFileError(
                f"config value n_experts = {self.n_experts} / shared_expert_d_ff = "
                f"{self.shared_expert_d_ff} is invalid: it must be ≥ 0"
            )
        if self.n_experts and not 1 <= self.n_experts_used <= self.n_experts:
            raise InvalidModelFileError(
                f"config value n_experts_used = {self.n_experts_used} is invalid: it must be "
                f"between 1 and n_experts ({self.n_experts})"
            )

    def _check_values(self) -> None:
        """Sizes are positive ints, ε and RoPE bases finite and > 0, RoPE's dims even and
        within a head: InvalidModelFileError naming the field otherwise (the loaders check the
        file's own keys first, naming them; this catches what a family derived)."""

        def bad(name: str, want: str) -> InvalidModelFileError:
            return InvalidModelFileError(
                f"config value {name} = {getattr(self, name)!r} is invalid: it must be {want}"
            )

        for name in SIZE_FIELDS:
            v, low = getattr(self, name), 0 if name == "n_layers" else 1  # 0 layers: a toy
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise bad(name, "a positive integer")
        for name in ("norm_eps", "rope_theta", "rope_local_theta", "embed_scale"):
            v = getattr(self, name)
            if v is None and name == "rope_local_theta":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise bad(name, "a finite number > 0")
        if self.position == "rope" and (self.rope_dim % 2 or self.rope_dim > self.head_dim):
            raise bad("rope_dim", f"even and at most head_dim ({self.head_dim})")

    def describe(self) -> list[tuple[str, str, str]]:
        """(seed stage, name, value) for every field: what ``clearlm info`` prints."""
        stage = {f.name: "model" for f in fields(self)}
        for n in (
            "position",
            "position_offset",
            "embed_scale",
            "embed_dim",
            "rope_theta",
            "rope_dim",
            "rope_scaling",
            "rope_local_theta",
            "vocab_size",
            "context_length",
        ):
            stage[n] = "1 input representation"
        for n in (
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "attn_bias",
            "attn_out_bias",
            "qk_norm",
            "qk_norm_scope",
            "clip_qkv",
            "attn_scale",
            "attn_softcap",
            "sliding_window",
            "layer_types",
        ):
            stage[n] = "2 multi-head self-attention"
        for n in (
            "d_model",
            "n_layers",
            "d_ff",
            "norm",
            "norm_eps",
            "norm_offset",
            "block",
            "ffn",
            "activation",
            "mlp_bias",
            "n_experts",
            "n_experts_used",
            "expert_d_ff",
            "norm_topk_prob",
            "shared_expert_d_ff",
            "dense_layers",
        ):
            stage[n] = "3 residual + norm + FFN"
        for n in ("final_norm", "tie_word_embeddings", "final_logit_softcap"):
            stage[n] = "4 output projection"
        rows = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "layer_types" and len(set(value)) == 1:
                value = f"{value[0]} × {len(value)}"
            elif f.name == "layer_types":
                value = " ".join("S" if v == "sliding" else "F" for v in value)
            rows.append(
                (stage[f.name], f.name, f"{value:g}" if isinstance(value, float) else str(value))
            )
        return rows
