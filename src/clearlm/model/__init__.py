"""The Transformer, one file per stage of the forward pass: the map of the readable path.

Shape letters used in every file's comments: B batch rows, T new tokens in this forward
(the prompt's length in a prefill, 1 in a decode step), S key positions (cached + new),
D d_model, H n_heads, K n_kv_heads (grouped-query attention: H / K query heads share one
key/value head), Hd head_dim, F the FFN's hidden width (d_ff), V the vocabulary.

=========================  ==============================================  ===================
seed stage                 file                                            class / function
=========================  ==============================================  ===================
text -> tokens             ``clearlm/tokenizer/core.py``                   ``Tokenizer.encode``
1. input representation    ``transformer.py`` (embed), ``positions.py``    ``Transformer``,
   (embedding + position)  (learned, sinusoidal, RoPE)                     ``RotaryEmbedding``
2. multi-head causal       ``attention.py``: Q, K, V; RoPE on Q and K;     ``Attention``,
   self-attention          softmax(QK^T / sqrt(Hd) + mask) V; KV cache     ``attention_mask``,
                           in ``kv_cache.py``                              ``KVCache``
3. residual + norm + FFN   ``norms.py``, ``ffn.py``, ``block.py``           ``RMSNorm``,
                           (pre-norm, post-norm and sandwich blocks)       ``GatedFFN``, ``Block``
4. output projection       ``transformer.py``: final norm, logits          ``Transformer``
5. softmax + sampling      ``clearlm/sampling/`` (chain.py, filters.py)    ``make_sampler``
again, autoregressively    ``clearlm/generation/loop.py``                  ``generate``
=========================  ==============================================  ===================

``moe.py`` is stage 3's FFN in a mixture-of-experts model (Mixtral, Qwen2/3-MoE, OLMoE): a
router picks each token's experts, each a ``GatedFFN``.

``hooks.py`` names a point at every stage (``blocks.3.attn.pattern``...) so that the trace and
explain views (:mod:`clearlm.inspect`) can read them; ``hook_aliases.py`` maps TransformerLens's
names (``blocks.3.attn.hook_pattern``) and layouts onto them; ``hook_checks.py`` checks a hook
function's signature and what it returns. Everything a model family changes is a
field of the frozen :class:`clearlm.config.ModelConfig`; nothing here knows file formats.

May import ``clearlm.config`` and ``clearlm.errors`` only (and torch).
"""
