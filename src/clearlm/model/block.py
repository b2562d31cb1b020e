"""One Transformer block (seed stage 3): attention and FFN sublayers, each with a residual."""

from __future__ import annotations

import torch

from clearlm.config import ModelConfig
from clearlm.model.attention import Attention
from clearlm.model.ffn import make_ffn
from clearlm.model.hooks import DirectCall, HookPoint
from clearlm.model.kv_cache import CacheRows
from clearlm.model.moe import MoE, is_moe_layer
from clearlm.model.norms import make_norm


class Block(DirectCall):
    """Attention then FFN, with residual connections and norms placed as the config says.

    - "pre" (GPT-2, Llama; Xiong et al. 2020): h = x + Attn(N1(x)); out = h + FFN(N2(h)).
    - "post" (the original Transformer, the seeds' formulas; OPT-350m):
      h = N1(x + Attn(x)); out = N2(h + FFN(h)).
    - "sandwich" (Gemma 2/3): h = x + N1b(Attn(N1(x))); out = h + N2b(FFN(N2(h))).

    Names follow transformers: N1 input_layernorm and N2 post_attention_layernorm for
    pre/post; Gemma 2's four: input_layernorm, post_attention_layernorm (after attention),
    pre_feedforward_layernorm, post_feedforward_layernorm. Shapes (B, T, D) → (B, T, D).
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.kind = config.block
        self.input_layernorm = make_norm(config)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = make_norm(config)
        if self.kind == "sandwich":
            self.pre_feedforward_layernorm = make_norm(config)
            self.post_feedforward_layernorm = make_norm(config)
        # a mixture of experts (model/moe.py) where the config has one for this layer
        self.mlp = MoE(config) if is_moe_layer(config, layer_idx) else make_ffn(config)
        self.hook_resid_pre, self.hook_resid_mid = HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        positions: torch.Tensor,
        cache: CacheRows | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x (B, T, D) → (B, T, D); rope (cos, sin_rot) of (T, rope_dim), per row (B, T,
        rope_dim) or (B, 1, T, rope_dim), or None; positions (T,) or (B, T); cache and mask as
        :meth:`clearlm.model.attention.Attention.forward`."""
        x = self.hook_resid_pre(x)
        if self.kind == "pre":
            attn = self.self_attn(self.input_layernorm(x), rope, positions, cache, mask)
            h = self.hook_resid_mid(x + attn)
            out = h + self.mlp(self.post_attention_layernorm(h))
        elif self.kind == "post":
            h = self.input_layernorm(x + self.self_attn(x, rope, positions, cache, mask))
            h = self.hook_resid_mid(h)
            out = self.post_attention_layernorm(h + self.mlp(h))
        else:
            attn = self.self_attn(self.input_layernorm(x), rope, positions, cache, mask)
            h = self.hook_resid_mid(x + self.post_attention_layernorm(attn))
            ffn = self.mlp(self.pre_feedforward_layernorm(h))
            out = h + self.post_feedforward_layernorm(ffn)
        return self.hook_resid_post(out)
