"""Where two models part ways on the same tokens: every hook point compared, layer by layer.

Model A is the reference (say float32 weights, or the better quantization), B the one under
test. Both run the same token ids; :func:`record` keeps the hook points of :func:`diff_names`
from each pass, and :func:`compare` (pure: two recorded dicts and two logit tensors in, a
:class:`ModelDiff` out) reads them:

- relative error of a point at position t: ``‖a_t − b_t‖₂ / ‖a_t‖₂`` over its D values, in
  float64 (0 where both are 0; ``inf`` where only A's is 0), for the embeddings, each block's
  ``attn.out`` / ``resid_mid`` / ``ffn.out`` / ``resid_post`` and the final norm's output;
- the first layer over the threshold: the first block whose ``resid_post`` (the residual stream
  it hands on, what every later block reads) has a relative error above ``threshold`` at some
  position. The sublayer outputs are listed beside it to say *which* half of the block moved it;
  they are not used for the threshold, as a small output (an FFN that barely writes) can have a
  large relative error that hardly changes the stream;
- the logits: KL(P_A ‖ P_B) per position (nats, :func:`clearlm.inspect.distance.kl_divergence`),
  top-1 agreement and max |Δlogit| (:class:`clearlm.inspect.distance.Accumulator`), and each
  model's perplexity of the text itself, exp(mean −log p(x_{t+1} | x_≤t)) over the T − 1
  predicted tokens (transformers' "Perplexity of fixed-length models", one window).

Shape letters: T tokens, N blocks, P points per block, D d_model, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from clearlm.config import ModelConfig
from clearlm.errors import ClearLMError
from clearlm.inspect.distance import Accumulator, Distance, kl_divergence
from clearlm.model.transformer import Transformer

BLOCK_POINTS = ("attn.out", "resid_mid", "ffn.out", "resid_post")  # P, in the order computed
THRESHOLD_POINT = "resid_post"
# One part in a hundred of the residual stream: far above the float32 summation noise of compact
# weights (SmolLM2, 12 tokens: below 1e-3 at most, mostly ~1e-6), about what rounding every weight
# again to 8 bits moves it (Qwen2.5-Coder-0.5B Q4_K_M against its Q8_0 copy: 0.56-0.88% on
# average, a few positions over), a tenth of a 4-bit rounding's (Q4_0 copy: 11-18%); measured in
# docs/inspect.md, "Diff two models".
DEFAULT_THRESHOLD = 0.01
ROWS = 64  # logit rows compared at a time: (64, V) float64 bounds the memory, not T


class NonFiniteError(ClearLMError):
    """A model's logits hold NaN or ±inf on the text (broken weights, or a 16-bit overflow)."""


class ModelsDifferError(ClearLMError):
    """The two models cannot be compared position by position: different tokenizers (vocabulary
    size or the ids of the text) or shapes (blocks, d_model). Exit code 2, a usage error."""

    exit_code = 2


@dataclass(frozen=True)
class ModelDiff:
    """Model B against model A on one text (all errors float64, relative; KL in nats).

    Attributes:
        tokens: the T token ids both models ran. text: their strings.
        points: the P per-block points, :data:`BLOCK_POINTS`.
        blocks: (N, P, T) relative error of each block's points at each position.
        embed, final_norm: (T,) relative error of the embeddings and of the final norm's output.
        kl: (T,) KL(P_A ‖ P_B) of the next-token distributions. top1: (T,) bool, argmax agrees.
        logits: the :class:`~clearlm.inspect.distance.Distance` summary over the T positions.
        nll_a, nll_b: (T − 1,) −log p(x_{t+1} | x_≤t) under each model (empty when T = 1).
        threshold: the relative error :attr:`first_layer` is measured against.
    """

    tokens: list[int]
    text: list[str]
    points: tuple[str, ...]
    blocks: torch.Tensor
    embed: torch.Tensor
    final_norm: torch.Tensor
    kl: torch.Tensor
    top1: torch.Tensor
    logits: Distance
    nll_a: torch.Tensor
    nll_b: torch.Tensor
    threshold: float

    @property
    def n_layers(self) -> int:
        return self.blocks.shape[0]

    def point(self, name: str) -> torch.Tensor:
        """(N, T) relative error of one block point (``"resid_post"``) at every block."""
        return self.blocks[:, self.points.index(name)]

    @property
    def first_layer(self) -> int | None:
        """The first block whose residual stream out (resid_post) differs by more than the
        threshold at some position; None when none does."""
        err = self.point(THRESHOLD_POINT)  # (N, T); NaN counts as over (compare refuses them)
        over = ((err > self.threshold) | err.isnan()).any(dim=1)  # (N,)
        return int(over.nonzero()[0]) if bool(over.any()) else None

    @property
    def perplexity_a(self) -> float | None:
        """Model A's perplexity of the text (None for a one-token text: nothing predicted)."""
        return _perplexity(self.nll_a)

    @property
    def perplexity_b(self) -> float | None:
        return _perplexity(self.nll_b)

    def to_dict(self) -> dict:
        """Plain numbers for ``--json``: per layer the max, mean and per-position error of each
        point, the logit statistics and the perplexities (None where undefined)."""

        def stat(err: torch.Tensor) -> dict:
            return {"max": _num(err.max()), "mean": _num(err.mean()),
                    "per_position": [_num(v) for v in err]}

        pa, pb = self.perplexity_a, self.perplexity_b
        return {
            "tokens": self.tokens,
            "text": self.text,
            "threshold": self.threshold,
            "threshold_point": THRESHOLD_POINT,
            "first_layer": self.first_layer,
            "points": list(self.points),
            "embed": stat(self.embed),
            "layers": [{"layer": i, **{p: stat(self.blocks[i, j])
                                        for j, p in enumerate(self.points)}}
                       for i in range(self.n_layers)],
            "final_norm": stat(self.final_norm),
            "logits": {
                "mean_kl": self.logits.mean_kl,
                "max_kl": self.logits.max_kl,
                "kl_per_position": [_num(v) for v in self.kl],
                "top1_agreement": self.logits.top1_agreement,
                "top1_per_position": [bool(v) for v in self.top1],
                "max_abs_logit": self.logits.max_abs_logit,
            },
            "perplexity": {"a": pa, "b": pb,
                           "difference": None if pa is None or pb is None else pb - pa},
        }


def _num(v: torch.Tensor) -> float | None:
    """A float for JSON (which has no infinity: None stands for it)."""
    x = float(v)
    return x if math.isfinite(x) else None


def _perplexity(nll: torch.Tensor) -> float | None:
    return math.exp(nll.mean().item()) if nll.numel() else None


def diff_names(n_layers: int) -> list[str]:
    """The hook points a diff records: embed, each block's :data:`BLOCK_POINTS`, final_norm."""
    blocks = [f"blocks.{i}.{p}" for i in range(n_layers) for p in BLOCK_POINTS]
    return ["embed", *blocks, "final_norm"]


def check_comparable(a: ModelConfig, b: ModelConfig, ids_a: Sequence[int],
                     ids_b: Sequence[int]) -> None:
    """Refuse a pair that cannot be compared position by position.

    Args:
        a, b: the two models' configs. ids_a, ids_b: the text encoded by each one's tokenizer.

    Raises:
        ModelsDifferError: vocabulary sizes, token ids, block counts, d_model, the attention's
            heads (n_heads, n_kv_heads, head_dim) or d_ff differ (one line naming the first
            difference). Every compared point is (T, D), so heads and d_ff would not make the
            shapes differ; but with other heads or FFN widths the blocks compute other functions,
            and their outputs are not one model's versions to compare point by point.
    """
    for what, x, y in (("vocabulary size", a.vocab_size, b.vocab_size),
                       ("number of blocks", a.n_layers, b.n_layers),
                       ("d_model", a.d_model, b.d_model),
                       ("n_heads", a.n_heads, b.n_heads),
                       ("n_kv_heads", a.n_kv_heads, b.n_kv_heads),
                       ("head_dim", a.head_dim, b.head_dim),
                       ("d_ff", a.d_ff, b.d_ff)):
        if x != y:
            raise ModelsDifferError(
                f"the models differ in {what} ({x} vs {y}): diff compares two versions of one "
                "model (quantizations, weights, dtypes), not different models")
    if list(ids_a) != list(ids_b):
        at = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y),
                  min(len(ids_a), len(ids_b)))
        raise ModelsDifferError(
            f"the tokenizers encode the text differently (token {at}: "
            f"{_id_at(ids_a, at)} vs {_id_at(ids_b, at)}; {len(ids_a)} vs {len(ids_b)} tokens): "
            "diff needs the same tokens in both models")


def _id_at(ids: Sequence[int], i: int) -> str:
    return str(ids[i]) if i < len(ids) else "end"


@torch.inference_mode()
def record(model: Transformer, ids: Sequence[int]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One forward pass over ``ids`` recording :func:`diff_names`.

    Returns:
        (name → tensor (1, T, D) in the model's dtype, logits (T, V) float32).
    """
    tokens = torch.tensor([list(ids)], dtype=torch.long, device=model.device)  # (1, T)
    with model.hooks.recording(set(diff_names(model.config.n_layers))) as recorded:
        logits = model(tokens)  # (1, T, V)
    return dict(recorded), logits[0].float()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖a_t − b_t‖₂ / ‖a_t‖₂ per position: (1, T, D) or (T, D) twice → (T,) float64 on the CPU.

    0 where the two rows are equal (also both zero), inf where only A's row is zero."""
    a = a.reshape(-1, a.shape[-1]).double().cpu()  # (T, D)
    b = b.reshape(-1, b.shape[-1]).double().cpu()
    num, den = (a - b).norm(dim=-1), a.norm(dim=-1)  # (T,) each
    return torch.where(num == 0, torch.zeros_like(num), num / den)  # x / 0 = inf


def next_token_nll(logits: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """−log p(x_{t+1} | x_≤t) for t = 0 … T − 2: logits (T, V) → (T − 1,) float64."""
    nll = []
    for r0 in range(0, logits.shape[0] - 1, ROWS):
        rows = logits[r0 : min(r0 + ROWS, logits.shape[0] - 1)].double()  # (R, V)
        nxt = torch.tensor(list(ids[r0 + 1 : r0 + 1 + rows.shape[0]]), device=rows.device)
        nll.append(-torch.log_softmax(rows, -1).gather(-1, nxt[:, None])[:, 0].cpu())  # (R,)
    return torch.cat(nll) if nll else torch.zeros(0, dtype=torch.float64)


def compare(
    recorded_a: Mapping[str, torch.Tensor],
    recorded_b: Mapping[str, torch.Tensor],
    logits_a: torch.Tensor,
    logits_b: torch.Tensor,
    tokens: Sequence[int],
    text: Sequence[str] = (),
    threshold: float = DEFAULT_THRESHOLD,
) -> ModelDiff:
    """B against A from two recordings of :func:`diff_names` and the two logits (T, V).

    Raises:
        ModelsDifferError: a point's shape differs between the two (not one model's versions).
        NonFiniteError: a model's logits hold NaN or ±inf (no KL, top-1 or perplexity exists:
            a NaN would silently pass every maximum and threshold).
        KeyError: a point of diff_names was not recorded.
    """
    for which, logits in (("A", logits_a), ("B", logits_b)):
        bad = ~torch.isfinite(logits).all(dim=-1)  # (T,)
        if bool(bad.any()):
            t = int(bad.nonzero()[0])
            at = f" ({text[t]!r})" if t < len(text) else ""
            raise NonFiniteError(
                f"model {which}'s logits contain NaN or inf at position {t}{at}, so there is no "
                "distribution to compare; check that model's weights (or use --dtype float32: "
                "float16 and bfloat16 can overflow)"
            )
    n_layers = sum(name.endswith(".resid_post") for name in recorded_a)

    def err(name: str) -> torch.Tensor:
        a, b = recorded_a[name], recorded_b[name]
        if a.shape != b.shape:
            raise ModelsDifferError(f"{name} has shape {tuple(a.shape)} in model A and "
                                    f"{tuple(b.shape)} in model B: not comparable")
        return relative_error(a, b)  # (T,)

    blocks = torch.stack([torch.stack([err(f"blocks.{i}.{p}") for p in BLOCK_POINTS])
                          for i in range(n_layers)])  # (N, P, T)
    acc, kl, top1 = Accumulator(), [], []
    for r0 in range(0, logits_a.shape[0], ROWS):  # rows at a time: (ROWS, V) float64
        la, lb = logits_a[r0 : r0 + ROWS], logits_b[r0 : r0 + ROWS]
        acc.add(la, lb)
        kl.append(kl_divergence(la, lb).cpu())
        top1.append((la.argmax(-1) == lb.argmax(-1)).cpu())
    return ModelDiff(
        tokens=list(tokens), text=list(text), points=BLOCK_POINTS, blocks=blocks,
        embed=err("embed"), final_norm=err("final_norm"), kl=torch.cat(kl),
        top1=torch.cat(top1), logits=acc.result(), nll_a=next_token_nll(logits_a, tokens),
        nll_b=next_token_nll(logits_b, tokens), threshold=threshold,
    )  # fmt: skip
