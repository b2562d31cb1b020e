"""TransformerLens's hook names as aliases of clearlm's, and the layout conversions between them.

TransformerLens (``transformer_lens/components/*.py``, ``HookedTransformer.py``) names its points
``blocks.0.attn.hook_pattern``, ``blocks.3.hook_resid_pre``, ``hook_embed``; clearlm's own names
(:data:`clearlm.model.hooks.HOOK_POINTS`) stay primary, and every place that takes a hook name
also takes a TransformerLens name from :data:`LENS_NAMES`. A TransformerLens name reads and
writes its tensor in TransformerLens's layout: the queries, keys and values are
``[batch, pos, head_index, d_head]`` there and (B, H, T, Hd) here, so a hook on
``blocks.0.attn.hook_q`` sees the transposed view and what it returns is transposed back.

Values are those of ``HookedTransformer.from_pretrained_no_processing`` (the checkpoint's own
numbers, as clearlm computes them). TransformerLens's default ``from_pretrained`` also folds the
norms' weights into the next matrices and centres the unembedding (and, for LayerNorm models,
the residual stream): the logits then differ by a constant per position (their differences and
softmax are the same) and the residual stream of LayerNorm models by its mean.

Some TransformerLens points have no clearlm point (the norms' internals, ``hook_result``, a gated
FFN's up projection) or none on some models (``hook_q`` is before RoPE and q-norm, where
clearlm's ``attn.q`` is after them: there it is ``hook_rot_q``): asking for one raises
ClearLMError saying why and what to use instead.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import torch
from torch import nn

from clearlm.config import ModelConfig
from clearlm.errors import ClearLMError

# How a TransformerLens tensor is laid out against clearlm's.
SAME = "same"  # the same tensor
HEADS = "heads"  # clearlm (B, H, T, Hd) ↔ TransformerLens [batch, pos, head_index, d_head]
POS = "pos"  # clearlm (T, D), broadcast over the batch ↔ [1, pos, d_model]
NORM = "norm"  # clearlm's final norm output ↔ TransformerLens's, before the weight and bias


@dataclass(frozen=True)
class LensName:
    """One row of the alias table: TransformerLens's shape, clearlm's point (None: no
    equivalent), the layout conversion, and a note (why none, or where values differ)."""

    target: str | None
    shape: str
    layout: str = SAME
    note: str = ""


_NO_NORM_POINT = "clearlm has no hook point inside a block's norms (hook the resid_* points)"
_QK = "models without RoPE or q/k-norm only; clearlm's is after both (there TL's hook_rot_{})"
_SANDWICH = "not on sandwich-norm families (Gemma 2/3): there TL's is after the post-{} norm"

# TransformerLens name → row, in the order of the forward pass. {i} is the block index. Shapes
# as TransformerLens writes them.
LENS_NAMES: dict[str, LensName] = {
    "hook_tokens": LensName(None, "[batch, pos]", note="the token ids: the input itself"),
    "hook_embed": LensName("embed", "[batch, pos, d_model]"),
    "hook_pos_embed": LensName(
        "pos", "[batch, pos, d_model]", POS,
        "learned/sinusoidal positions only; clearlm gives [1, pos, d_model] (one row for all)",
    ),
    "blocks.{i}.hook_resid_pre": LensName("blocks.{i}.resid_pre", "[batch, pos, d_model]"),
    "blocks.{i}.ln1.hook_scale": LensName(None, "[batch, pos, 1]", note=_NO_NORM_POINT),
    "blocks.{i}.ln1.hook_normalized": LensName(None, "[batch, pos, d_model]",
                                               note=_NO_NORM_POINT),
    "blocks.{i}.hook_attn_in": LensName(
        None, "[batch, pos, head_index, d_model]", note="no per-head copy of the attention "
        "input in clearlm; hook blocks.{i}.resid_pre",
    ),
    "blocks.{i}.hook_q_input": LensName(None, "[batch, pos, head_index, d_model]",
                                        note="as hook_attn_in"),
    "blocks.{i}.hook_k_input": LensName(None, "[batch, pos, head_index, d_model]",
                                        note="as hook_attn_in"),
    "blocks.{i}.hook_v_input": LensName(None, "[batch, pos, head_index, d_model]",
                                        note="as hook_attn_in"),
    "blocks.{i}.attn.hook_q": LensName(
        "blocks.{i}.attn.q", "[batch, pos, head_index, d_head]", HEADS, _QK.format("q")
    ),
    "blocks.{i}.attn.hook_k": LensName(
        "blocks.{i}.attn.k", "[batch, pos, kv_head_index, d_head]", HEADS, _QK.format("k")
    ),
    "blocks.{i}.attn.hook_v": LensName(
        "blocks.{i}.attn.v", "[batch, pos, kv_head_index, d_head]", HEADS
    ),
    "blocks.{i}.attn.hook_rot_q": LensName(
        "blocks.{i}.attn.q", "[batch, pos, head_index, d_head]", HEADS, "RoPE models only"
    ),
    "blocks.{i}.attn.hook_rot_k": LensName(
        "blocks.{i}.attn.k", "[batch, pos, kv_head_index, d_head]", HEADS, "RoPE models only"
    ),
    "blocks.{i}.attn.hook_attn_scores": LensName(
        "blocks.{i}.attn.scores", "[batch, head_index, query_pos, key_pos]"
    ),
    "blocks.{i}.attn.hook_pattern": LensName(
        "blocks.{i}.attn.pattern", "[batch, head_index, query_pos, key_pos]"
    ),
    "blocks.{i}.attn.hook_z": LensName("blocks.{i}.attn.z", "[batch, pos, head_index, d_head]"),
    "blocks.{i}.attn.hook_result": LensName(
        None, "[batch, pos, head_index, d_model]",
        note="each head's output projected to d_model (TL's use_attn_result): compute it from "
        "blocks.{i}.attn.z and o_proj's columns of that head",
    ),
    "blocks.{i}.hook_attn_out": LensName(
        "blocks.{i}.attn.out", "[batch, pos, d_model]", note=_SANDWICH.format("attention")
    ),
    "blocks.{i}.hook_resid_mid": LensName("blocks.{i}.resid_mid", "[batch, pos, d_model]"),
    "blocks.{i}.hook_mlp_in": LensName(
        None, "[batch, pos, d_model]",
        note="TL's copy of resid_mid fed to the MLP alone; hook blocks.{i}.resid_mid (a "
        "replacement there also changes the residual stream)",
    ),
    "blocks.{i}.ln2.hook_scale": LensName(None, "[batch, pos, 1]", note=_NO_NORM_POINT),
    "blocks.{i}.ln2.hook_normalized": LensName(None, "[batch, pos, d_model]",
                                               note=_NO_NORM_POINT),
    "blocks.{i}.mlp.hook_pre": LensName(
        "blocks.{i}.ffn.pre_act", "[batch, pos, d_mlp]", note="the gate for gated FFNs, as TL's"
    ),
    "blocks.{i}.mlp.hook_pre_linear": LensName(
        None, "[batch, pos, d_mlp]",
        note="a gated FFN's up projection has no clearlm point (ffn.act is act(gate) × up)",
    ),
    "blocks.{i}.mlp.hook_mid": LensName(None, "[batch, pos, d_mlp]", note="SoLU models only"),
    "blocks.{i}.mlp.hook_post": LensName("blocks.{i}.ffn.act", "[batch, pos, d_mlp]"),
    "blocks.{i}.hook_mlp_out": LensName(
        "blocks.{i}.ffn.out", "[batch, pos, d_model]", note=_SANDWICH.format("feedforward")
    ),
    "blocks.{i}.hook_resid_post": LensName("blocks.{i}.resid_post", "[batch, pos, d_model]"),
    "ln_final.hook_scale": LensName(
        None, "[batch, pos, 1]", note="clearlm has no hook point inside the final norm "
        "(ln_final.hook_normalized and unembed.hook_in: its output without and with the weight)",
    ),
    "ln_final.hook_normalized": LensName(
        "final_norm", "[batch, pos, d_model]", NORM,
        "before the norm's weight and bias, as TL's: final_norm with them divided out "
        "(equal up to float rounding)",
    ),
    "unembed.hook_in": LensName("final_norm", "[batch, pos, d_model]",
                                note="the output projection's input (after the weight)"),
    "unembed.hook_out": LensName(
        "logits", "[batch, pos, d_vocab]", note="not with a final logit soft-cap (Gemma 2)"
    ),
}


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(r"\{i\}", r"(\d+)") + "$")


_PATTERNS = [(_pattern(t), t) for t in LENS_NAMES]


def match_lens_name(name: str) -> tuple[str, int | None] | None:
    """``blocks.3.attn.hook_q`` → (``blocks.{i}.attn.hook_q``, 3); None for any other name."""
    for pattern, template in _PATTERNS:
        m = pattern.match(name)
        if m:
            return template, int(m.group(1)) if m.groups() else None
    return None


def lens_target(name: str) -> str | None:
    """The clearlm point a TransformerLens name stands for on models where it has one
    (``blocks.3.hook_resid_pre`` → ``blocks.3.resid_pre``); None for any other name."""
    found = match_lens_name(name)
    if found is None or LENS_NAMES[found[0]].target is None:
        return None
    target = LENS_NAMES[found[0]].target
    assert target is not None
    return target if found[1] is None else target.replace("{i}", str(found[1]))


def unavailable(template: str, config: ModelConfig) -> str | None:
    """Why a TransformerLens point that has a clearlm target is not that target on this model
    (None: it is)."""
    rope, sandwich = config.position == "rope", config.block == "sandwich"
    if template.endswith(("attn.hook_q", "attn.hook_k")):
        if rope:
            letter = template[-1]
            return (f"clearlm's attn.{letter} is after RoPE: that is TransformerLens's "
                    f"{template.replace('hook_', 'hook_rot_')}")
        if config.qk_norm:
            return "clearlm's queries and keys are after the q/k-norm; TL's hook_q/hook_k before"
    if template.endswith(("hook_rot_q", "hook_rot_k")) and not rope:
        return "this model has no RoPE: use hook_q / hook_k"
    if template == "hook_pos_embed" and rope:
        return "this model uses RoPE: positions enter inside attention (hook_rot_q, hook_rot_k)"
    if template.endswith(("hook_attn_out", "hook_mlp_out")) and sandwich:
        return "on a sandwich-norm model TL's is after the post-sublayer norm, clearlm's before"
    if template == "ln_final.hook_normalized" and not config.final_norm:
        return "this model has no final norm; read unembed.hook_in"
    if template == "unembed.hook_out" and config.final_logit_softcap is not None:
        return "TL's is before the final logit soft-cap, clearlm's logits after it"
    return None


@dataclass(frozen=True)
class Alias:
    """A TransformerLens name resolved on one model: the clearlm point it reads and how a
    tensor converts. ``norm`` is the model's final norm (NORM layout only)."""

    name: str
    target: str
    layout: str
    norm: nn.Module | None = None

    def _affine(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The final norm's y = x̂ · scale + shift, as (scale, shift) in x's dtype, (D,)."""
        assert self.norm is not None
        scale = self.norm.weight + getattr(self.norm, "offset", 0.0)
        shift = getattr(self.norm, "bias", None)
        return scale.to(x.dtype), None if shift is None else shift.to(x.dtype)

    def to_lens(self, x: torch.Tensor) -> torch.Tensor:
        """clearlm's tensor → TransformerLens's layout (a view where it can be one, so a hook
        that edits it in place, as TransformerLens hooks may, edits the pass)."""
        if self.layout == HEADS:
            return x.transpose(1, 2)  # (B, H, T, Hd) → (B, T, H, Hd)
        if self.layout == POS:
            return x if x.dim() == 3 else x[None]  # (T, D) → (1, T, D)
        if self.layout == NORM:
            scale, shift = self._affine(x)
            return (x if shift is None else x - shift) / scale  # x̂, before the weight
        return x

    def from_lens(self, x: torch.Tensor) -> torch.Tensor:
        """TransformerLens's layout → clearlm's (the inverse of :meth:`to_lens`). A
        [batch, pos, d_model] position encoding stays 3-D: clearlm adds it to (B, T, D)."""
        if self.layout == HEADS:
            return x.transpose(1, 2)  # (B, T, H, Hd) → (B, H, T, Hd)
        if self.layout == NORM:
            scale, shift = self._affine(x)
            return x * scale if shift is None else x * scale + shift
        return x


def lens_alias(name: str, config: ModelConfig, final_norm: nn.Module | None) -> Alias | None:
    """The alias a TransformerLens name stands for on this model; None if `name` is not one.

    Raises:
        ClearLMError: the name has no clearlm equivalent (at all, or on this model), or its
            block does not exist; the message says why and what to hook instead.
    """
    found = match_lens_name(name)
    if found is None:
        return None
    template, layer = found
    check_lens_name(name, config.n_layers)
    why = unavailable(template, config)
    if why is not None:
        why = why.replace("{i}", str(layer))
        raise ClearLMError(f"TransformerLens's {name!r} has no clearlm equivalent here: {why}")
    row = LENS_NAMES[template]
    assert row.target is not None  # check_lens_name refused the others
    target = row.target.replace("{i}", str(layer))
    if row.layout != NORM:
        return Alias(name, target, row.layout)
    if final_norm is None:
        raise ClearLMError(f"TransformerLens's {name!r}: this model has no final norm module")
    alias = Alias(name, target, NORM, final_norm)
    scale, _ = alias._affine(final_norm.weight)
    if bool((scale == 0).any()):  # x̂ · 0 cannot be divided back
        raise ClearLMError(f"{name!r} cannot be recovered: the final norm has a zero weight")
    return alias


def check_lens_name(name: str, n_layers: int) -> bool:
    """Whether `name` is a TransformerLens name with a clearlm equivalent on some model of
    n_layers blocks (False: not a TransformerLens name at all).

    Raises:
        ClearLMError: a TransformerLens name with no clearlm equivalent (the message says what
            to hook instead), or one whose block index is past the last block.
    """
    found = match_lens_name(name)
    if found is None:
        return False
    template, layer = found
    if layer is not None and layer >= n_layers:
        raise ClearLMError(no_block_message(name, layer, n_layers))
    row = LENS_NAMES[template]
    if row.target is None:
        raise ClearLMError(
            f"TransformerLens's {name!r} has no clearlm equivalent: "
            + row.note.replace("{i}", str(layer))
        )
    return True


def lens_names_of(config: ModelConfig) -> list[str]:
    """Every TransformerLens name that has a clearlm point on a model with this config, in
    TransformerLens's order (the keys of a full ``run_with_cache``)."""
    out = []
    for template, row in LENS_NAMES.items():
        if row.target is None or unavailable(template, config) is not None:
            continue
        if "{i}" in template:
            out += [template.replace("{i}", str(i)) for i in range(config.n_layers)]
        else:
            out.append(template)
    return sorted(out, key=_lens_order)


def _lens_order(name: str) -> tuple[int, int]:
    """TransformerLens's cache order: hook_embed, hook_pos_embed, the blocks in order, then
    ln_final and unembed."""
    m = re.match(r"blocks\.(\d+)\.", name)
    if m:
        return 1 + int(m.group(1)), 0
    return (0, 0) if name.startswith("hook_") else (1 << 30, 0)


def no_block_message(name: str, layer: int, n_layers: int) -> str:
    """The error line for a name whose block index is past the last block."""
    return (f"unknown hook point {name!r}: block {layer} does not exist, the model has "
            f"{n_layers} blocks (0 … {n_layers - 1})")


def nearest_name(name: str, templates: list[str], n_layers: int) -> str | None:
    """The hook name closest to a mistyped one, over the templates given (clearlm's and
    TransformerLens's) with ``{i}`` set to the block the name asks for (else 0); None when
    nothing is close (difflib's ratio < 0.6)."""
    m = re.search(r"\d+", name)
    i = min(int(m.group()), max(n_layers - 1, 0)) if m else 0
    candidates = [t.replace("{i}", str(i)) for t in templates]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if close:
        return close[0]
    # the last part alone ("hook_patern" → "pattern"), for a name given without its path
    leaf = name.rsplit(".", 1)[-1].removeprefix("hook_")
    leaves = {c.rsplit(".", 1)[-1].removeprefix("hook_"): c for c in reversed(candidates)}
    close = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.75)
    return leaves[close[0]] if close else None
