"""Write tiny Llama-architecture GGUF files for fast tests (random weights, byte-level vocab).

The files are written with the `gguf` package's own writer, the way llama.cpp's converter
writes real ones: Q and K rows permuted into llama.cpp's RoPE layout, shapes in GGUF order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValue, GGUFWriter
from gguf.quants import quant_shape_to_byte_shape, quantize

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_alphabet() -> list[str]:
    """GPT-2's byte → printable-character table (Radford et al. 2019, encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def permute_for_llama_cpp(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter layout: each head's rows [half0 | half1] → interleaved pairs."""
    out = w.shape[0]
    return w.reshape(n_heads, 2, out // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# where a block's float16 scales lie (ggml-common.h): random bytes there could be NaN or inf
F16_FIELDS = {GGMLQuantizationType.Q2_K: (80, 82), GGMLQuantizationType.Q3_K: (108,),
              GGMLQuantizationType.Q4_K: (0, 2), GGMLQuantizationType.Q5_K: (0, 2),
              GGMLQuantizationType.Q6_K: (208,), GGMLQuantizationType.IQ4_NL: (0,),
              GGMLQuantizationType.IQ4_XS: (0,), GGMLQuantizationType.TQ1_0: (52,),
              GGMLQuantizationType.TQ2_0: (64,), GGMLQuantizationType.IQ1_M: ()}


def random_raw(rng: np.random.Generator, shape: tuple[int, ...],
               kind: GGMLQuantizationType, scale: float = 1e-4) -> np.ndarray:
    """Random blocks of ``kind`` for a float tensor of ``shape`` (rows, values): every byte
    random but the float16 scales (F16_FIELDS), which are finite, |N(0, scale)|. Any byte
    pattern is a valid block, so this covers codes gguf's quantizer never writes."""
    raw = rng.integers(0, 256, size=quant_shape_to_byte_shape(shape, kind), dtype=np.uint8)
    size = GGML_QUANT_SIZES[kind][1]
    blocks = raw.reshape(-1, size)  # (n_blocks, type_size), a view
    for off in F16_FIELDS.get(kind, (0,)):
        d = np.abs(rng.standard_normal(blocks.shape[0]) * scale).astype(np.float16)
        blocks[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    if kind == GGMLQuantizationType.IQ1_M:  # its float16 scale lies in the top nibbles of the
        d = np.abs(rng.standard_normal(blocks.shape[0]) * scale).astype(np.float16)  # 4
        bits = d.view(np.uint16)  # uint16 sub-scales at bytes 48..55 (ggml-common.h)
        for i in range(4):
            nibble = ((bits >> (4 * i)) & 0xF).astype(np.uint8)
            blocks[:, 49 + 2 * i] = (blocks[:, 49 + 2 * i] & 0x0F) | (nibble << 4)
    return raw


def write_tiny_llama(
    path: Path,
    *,
    arch: str = "llama",
    d_model: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    d_ff: int = 128,
    context_length: int = 64,
    tied: bool = True,
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.F32,
    seed: int = 0,
    chat_template: str | None = CHATML,
    overrides: dict | None = None,
    sorted_names: bool = False,
    tensor_types: dict[str, GGMLQuantizationType] | None = None,
) -> Path:
    """Write a random tiny model: 256 byte tokens, 3 merges, 3 special tokens; return its path.
    ``chat_template=None`` leaves the template out (as in Gemma 3 270M base). ``overrides``
    maps a metadata key to (value, GGUFValueType), written over the standard value (bad-file
    tests). ``sorted_names``: tensors in name order (``blk.0.attn_k`` before ``blk.0.attn_q``,
    as in the real SmolLM2, Qwen2.5 and Gemma 3 files) instead of Q, K, V, … order.
    ``tensor_types`` maps a name's last part (``attn_v``) to its type in every layer instead of
    ``matrix_type``."""
    rng = np.random.default_rng(seed)
    merged = ["he", "ll", "ĠĠ"]  # a few merges so the BPE has some to apply
    tokens = byte_level_alphabet() + merged + SPECIALS
    vocab = len(tokens)
    hd = d_model // n_heads
    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length(context_length)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([1] * (256 + len(merged)) + [3] * len(SPECIALS))
    w.add_token_merges(["h e", "l l", "Ġ Ġ"])
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for key, (value, vtype) in (overrides or {}).items():
        w.kv_data[0][key] = GGUFValue(value=value, type=vtype)

    def mat(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * 0.1).astype(np.float32)

    tensors: list[tuple[str, np.ndarray, GGMLQuantizationType | None]] = []

    def add(name: str, a: np.ndarray, quant: bool = True) -> None:
        kind = (tensor_types or {}).get(name.split(".")[-2], matrix_type)
        if kind in (GGMLQuantizationType.F16, GGMLQuantizationType.F64):
            tensors.append((name, a.astype(np.dtype(kind.name.lower().replace("f", "float"))),
                            None))
        elif quant and kind != GGMLQuantizationType.F32:
            try:
                raw = quantize(a, kind)
            except NotImplementedError:  # gguf cannot quantize every type: random bytes will do
                raw = random_raw(rng, a.shape, kind)
            tensors.append((name, raw, kind))
        else:
            tensors.append((name, a, None))

    add("token_embd.weight", mat(vocab, d_model))
    add("output_norm.weight", 1 + 0.1 * rng.standard_normal(d_model).astype(np.float32), False)
    if not tied:
        add("output.weight", mat(vocab, d_model))
    for i in range(n_layers):
        p = f"blk.{i}."
        add(
            p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(d_model).astype(np.float32), False
        )
        add(p + "attn_q.weight", permute_for_llama_cpp(mat(n_heads * hd, d_model), n_heads))
        add(p + "attn_k.weight", permute_for_llama_cpp(mat(n_kv_heads * hd, d_model), n_kv_heads))
        add(p + "attn_v.weight", mat(n_kv_heads * hd, d_model))
        add(p + "attn_output.weight", mat(d_model, n_heads * hd))
        add(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(d_model).astype(np.float32), False)
        add(p + "ffn_gate.weight", mat(d_ff, d_model))
        add(p + "ffn_up.weight", mat(d_ff, d_model))
        add(p + "ffn_down.weight", mat(d_model, d_ff))
    for name, a, raw_dtype in sorted(tensors) if sorted_names else tensors:
        w.add_tensor(name, a, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
