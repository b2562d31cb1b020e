"""TransformerLens's vocabulary on a clearlm model: the cache ``run_with_cache`` returns, the
``cfg`` object, the ``hook`` argument of a hook function and ``get_act_name``'s shorthand.

TransformerLens (github.com/TransformerLensOrg/TransformerLens) is not imported: these are
clearlm's own small classes with the names, keys and shapes its users type, so a notebook
written against ``HookedTransformer`` runs on a GGUF file once ``clearlm.load`` replaces
``HookedTransformer.from_pretrained``. The names and their shapes are
:data:`clearlm.model.hook_aliases.LENS_NAMES`; ``Model``'s methods are in
:mod:`clearlm.api.lens`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from clearlm.config import ModelConfig
from clearlm.errors import CacheKeyError, ClearLMError, DeviceError
from clearlm.model.hook_aliases import lens_target
from clearlm.model.hook_checks import check_lens_fn
from clearlm.model.hooks import HookFn

# get_act_name's shorthand (TransformerLens utilities/components_utils.py, documented there)
_ACT_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_mid": "mid",
    "mlp_post": "post",
}
_ATTN = {"k", "v", "q", "z", "rot_k", "rot_q", "result", "pattern", "attn_scores"}
_MLP = {"pre", "post", "mid", "pre_linear"}
_LAYER_TYPES = {"a": "attn", "m": "mlp", "b": "", "block": "", "blocks": "", "attention": "attn"}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """TransformerLens's shorthand → a full hook name, as its ``utils.get_act_name``:
    ``("pattern", 0)`` → ``blocks.0.attn.hook_pattern``, ``("resid_pre", 3)`` →
    ``blocks.3.hook_resid_pre``, ``"embed"`` → ``hook_embed``, ``"k6"`` → ``blocks.6.attn.hook_k``,
    ``("normalized", None)`` → ``ln_final.hook_normalized``. A full name is returned as is."""
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    m = re.fullmatch(r"([a-z_]+?)(\d+)([a-z]?.*)", name)  # "k6", "scale4ln1"
    if m:
        name, layer, layer_type = m.group(1), int(m.group(2)), m.group(3) or None
    name = _ACT_ALIASES.get(name, name)
    if name in _ATTN:
        layer_type = "attn"
    elif name in _MLP:
        layer_type = "mlp"
    elif layer_type in _LAYER_TYPES:
        layer_type = _LAYER_TYPES[layer_type]
    out = f"blocks.{layer}." if layer is not None else ""
    out += f"{layer_type}." if layer_type else ""
    out += f"hook_{name}"
    if name in ("scale", "normalized") and layer is None:
        out = "ln_final." + out
    return out


class LensCache(Mapping[str, torch.Tensor]):
    """What ``Model.run_with_cache`` returns: recorded tensors under TransformerLens names (and
    any clearlm names asked for), like TransformerLens's ``ActivationCache``.

    ``cache["blocks.0.attn.hook_pattern"]``, the shorthand ``cache["pattern", 0]``,
    ``cache["resid_pre", -1]`` (negative layers count from the end), ``cache["q", 0, "attn"]``;
    ``keys()``, ``items()``, ``len``, ``in``, ``remove_batch_dim()``, ``to(device)``. Shapes as
    TransformerLens's (see clearlm.model.hook_aliases.LENS_NAMES), with the batch dimension
    first unless removed. TransformerLens's analysis helpers (``accumulated_resid``,
    ``decompose_resid``, ``logit_attrs``...) are not here.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], n_layers: int,
                 has_batch_dim: bool = True) -> None:
        self.cache_dict, self.n_layers, self.has_batch_dim = tensors, n_layers, has_batch_dim

    def name_of(self, key: str | tuple[Any, ...]) -> str:
        """The full name a key stands for (a name, a shorthand, or a (name, layer, type)
        tuple), as TransformerLens's ``ActivationCache.__getitem__`` reads it.

        Raises CacheKeyError (a KeyError) for a key of another form, or a layer outside
        −n_layers … n_layers − 1."""
        if isinstance(key, str):
            name = key if key in self.cache_dict else get_act_name(key)
        elif isinstance(key, tuple) and key and isinstance(key[0], str):
            name, layer, *rest = (*key, None) if len(key) == 1 else key
            if isinstance(layer, int) and not isinstance(layer, bool):
                self._check_layer(layer, key)
                layer %= self.n_layers  # cache["resid_post", -1]: the last block
            name = get_act_name(name, layer, *rest[:1])
        else:
            raise CacheKeyError(
                f"a cache key is a name or (name, layer[, layer_type]), got {key!r}"
            )
        m = re.match(r"blocks\.(\d+)\.", name)
        if m and name not in self.cache_dict:
            self._check_layer(int(m.group(1)), key)
        return name

    def _check_layer(self, layer: int, key: object) -> None:
        """CacheKeyError naming the valid range unless −n_layers ≤ layer < n_layers."""
        N = self.n_layers
        if not -N <= layer < N:
            raise CacheKeyError(
                f"cache key {key!r}: layer {layer} does not exist, the model has {N} blocks "
                f"(0 … {N - 1}, or -{N} … -1 from the end)"
            )

    def __getitem__(self, key: str | tuple[Any, ...]) -> torch.Tensor:
        name = self.name_of(key)
        if name not in self.cache_dict:
            hint = self._hint(name)
            raise CacheKeyError(f"{name!r} is not in this cache ({len(self)} names){hint}")
        return self.cache_dict[name]

    def _hint(self, name: str) -> str:
        """``; did you mean ...?``: a key recorded from the same clearlm point (``hook_k`` →
        ``hook_rot_k`` on a RoPE model, whose keys are after RoPE), else the nearest by
        spelling; empty when nothing is close."""
        target = lens_target(name) or name
        same = [k for k in self.cache_dict if (lens_target(k) or k) == target]
        near = same or difflib.get_close_matches(name, list(self.cache_dict), n=1, cutoff=0.6)
        return f"; did you mean {near[0]!r}?" if near else ""

    def __contains__(self, key: object) -> bool:
        try:
            return self.name_of(key) in self.cache_dict  # type: ignore[arg-type]
        except KeyError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache_dict)

    def __len__(self) -> int:
        return len(self.cache_dict)

    def __repr__(self) -> str:
        return f"LensCache with keys {list(self.cache_dict)}"

    def remove_batch_dim(self) -> LensCache:
        """Drop the batch dimension of every tensor (batch size 1 only), in place; returns self.

        Raises ClearLMError for a batch of more than one row."""
        if self.has_batch_dim:
            if any(t.shape[0] != 1 for t in self.cache_dict.values()):
                raise ClearLMError("remove_batch_dim needs a batch of one row")
            self.cache_dict = {k: t[0] for k, t in self.cache_dict.items()}
            self.has_batch_dim = False
        return self

    def to(self, device: str | torch.device) -> LensCache:
        """Move every tensor to `device`, in place; returns self.

        Raises DeviceError for a device torch does not know or this machine lacks."""
        try:
            self.cache_dict = {k: t.to(device) for k, t in self.cache_dict.items()}
        except (RuntimeError, AssertionError, TypeError) as e:  # torch's "not compiled with"
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DeviceError(f"cannot move the cache to {device!r}: {reason}") from None
        return self


@dataclass
class HookInfo:
    """The ``hook`` argument a TransformerLens-style hook function receives: ``hook.name`` is
    the name it was registered under, ``hook.layer()`` its block, ``hook.ctx`` a dict kept
    between calls of the same registration."""

    name: str
    ctx: dict[str, Any] = field(default_factory=dict)

    def layer(self) -> int:
        """The block index in the name (``blocks.3.attn.hook_z`` → 3).

        Raises ValueError for a name outside the blocks (``hook_embed``)."""
        m = re.match(r"blocks\.(\d+)\.", self.name)
        if m is None:
            raise ValueError(f"{self.name!r} is not inside a block")
        return int(m.group(1))


LensHookFn = Callable[..., torch.Tensor | None]  # fn(activation, hook=HookInfo)
NameOrFilter = str | Callable[[str], bool]


def lens_hooks(
    fwd_hooks: Iterable[tuple[NameOrFilter, LensHookFn]], names: Sequence[str]
) -> list[tuple[str, HookFn]]:
    """TransformerLens's ``fwd_hooks`` → clearlm's (name, fn(tensor, name)) pairs.

    Each entry is (name or filter, fn): a name may be clearlm's or TransformerLens's; a filter
    ``f(name) -> bool`` chooses among `names` (the model's TransformerLens names). Each fn is
    called as TransformerLens calls it, ``fn(activation, hook=HookInfo(name))``; if it returns
    a tensor, that replaces the activation.

    Raises:
        ClearLMError: an entry is not a (name or filter, function) pair, or fn cannot be
            called as fn(activation, hook=...) (a clearlm-style fn(tensor, name), say).
    """
    out: list[tuple[str, HookFn]] = []
    for entry in fwd_hooks:
        if not (isinstance(entry, tuple | list) and len(entry) == 2):
            raise ClearLMError(f"fwd_hooks holds (name, function) pairs, got {entry!r}")
        which, fn = entry
        if not isinstance(which, str) and not callable(which):
            raise ClearLMError(f"a hook's name is a string or a filter function, got {which!r}")
        check_lens_fn(str(which), fn)  # ClearLMError: not fn(activation, hook=...)
        chosen = [which] if isinstance(which, str) else [n for n in names if which(n)]
        for name in chosen:
            info = HookInfo(name)
            out.append((name, lambda x, _n, fn=fn, info=info: fn(x, hook=info)))
    return out


def names_wanted(names_filter: NameOrFilter | Sequence[str] | None,
                 names: Sequence[str]) -> list[str]:
    """run_with_cache's ``names_filter`` → the names to record: None = all of `names` (the
    model's TransformerLens names), a name, a list of names (TransformerLens's or clearlm's),
    or a filter function over `names`.

    Raises ClearLMError for anything else."""
    if names_filter is None:
        return list(names)
    if isinstance(names_filter, str):
        return [names_filter]
    if callable(names_filter):
        return [n for n in names if names_filter(n)]
    if isinstance(names_filter, Sequence) and all(isinstance(n, str) for n in names_filter):
        return list(dict.fromkeys(names_filter))
    raise ClearLMError(
        "names_filter is a name, a list of names or a function name -> bool, got "
        + type(names_filter).__name__
    )


@dataclass(frozen=True)
class LensConfig:
    """``model.cfg``: the sizes under TransformerLens's ``HookedTransformerConfig`` names,
    mapped from :class:`clearlm.config.ModelConfig` (d_mlp = d_ff, d_vocab = vocab_size,
    n_ctx = context_length; n_key_value_heads is None without grouped-query attention).
    ``default_prepend_bos`` is the file's own rule (TransformerLens's default is True)."""

    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    d_vocab_out: int
    n_ctx: int
    n_key_value_heads: int | None
    act_fn: str
    gated_mlp: bool
    normalization_type: str
    positional_embedding_type: str
    original_architecture: str
    default_prepend_bos: bool
    device: torch.device
    dtype: torch.dtype

    @classmethod
    def of(cls, config: ModelConfig, prepend_bos: bool, device: torch.device,
           dtype: torch.dtype) -> LensConfig:
        """The TransformerLens view of a clearlm config."""
        act = {"gelu_tanh": "gelu_new"}.get(config.activation, config.activation)
        position = {"rope": "rotary", "learned": "standard"}.get(config.position, config.position)
        kv = config.n_kv_heads if config.n_kv_heads != config.n_heads else None
        return cls(
            config.n_layers, config.d_model, config.n_heads, config.head_dim, config.d_ff,
            config.vocab_size, config.vocab_size, config.context_length, kv, act,
            config.ffn == "gated", "RMS" if config.norm == "rms" else "LN", position,
            config.architecture, prepend_bos, device, dtype,
        )
