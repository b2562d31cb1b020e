// Matrix-vector (and few-row matrix) products that read block-quantized weights directly.
//
// A weight W (N, K) is stored as integer codes plus one scale (and optionally one offset, "min")
// per block of `bs` consecutive values of a row:
//   W[n, k] = scale[n, k/bs] * code[n, k] + min[n, k/bs].
// Without a min, 8-bit codes are signed (min = 0) and 4/5-bit codes are centred as in ggml's
// Q4_0 / Q5_0: W = scale * (code - 8) or scale * (code - 16).  Three code layouts:
//   bits = 8: int8 codes (N, K), bs 16 or 32 (Q8_0: bs 32; Q6_K: bs 16);
//   bits = 4: uint8 (N, K/2), bs = 32; byte j of a block holds code j in its low nibble and code
//             j + 16 in its high nibble (ggml's Q4_0/Q4_1 layout; Q4_K is repacked into it);
//   bits = 5: uint8 (N, K/32*20), bs = 32; per block the 16 nibble bytes as for bits = 4, then a
//             little-endian uint32 whose bit j is bit 4 of code j (ggml's Q5_0/Q5_1 qs and qh);
//   bits = 6 / 3 / 2: uint8 (N, K/64 * 8 * bits), "field codes": Q6_K's 6-bit codes q
//             (W = scale * (q - 32)), Q3_K's 3-bit codes (W = scale * (q - 4)) or Q2_K's 2-bit
//             codes (W = scale * q + min) in code blocks of 64 values (8 * bits bytes) with a
//             scale (and min) per 16: a little-endian stream of `bits`-bit fields, code j at bits
//             bits*j .. bits*j + bits - 1 (8 codes per `bits` bytes). AVX-512 VBMI turns a block
//             into 64 int8 codes in 3 vector operations and 16 of them at a time into float32
//             codes times a power of two in 2 (field_reg, field_dwords); other builds into the
//             int8 codes (unpack_fields); the scales are d * sc times the inverse power of two
//             (field_unit): the same float32 weights, bit for bit.
// Scales and mins are float32 or float16 tensors (N, K/bs), or, for Q4_K (bits = 4, bs = 32),
// or Q5_K (bits = 5, bs = 32) the file's super-block heads (quant/kheads.py): scale uint8
// (N, K/256, 16) = d, dmin (float16)
// and 12 bytes of 6-bit sub-scales sc and sub-mins m, min empty; for Q6_K (bits = 6, or the
// int8 codes it was held as before, bits = 8, bs = 16) uint8 (N, K/256, 18) = 16 int8 sub-scales
// sc and d; for Q3_K (bits = 3) uint8 (N, K/256, 14) = the file's 12 bytes of 6-bit sub-scales
// and d. expand_heads turns a band's heads into
// the float32 scale d*sc (and min -(dmin*m)) of each block (exact products), so the products
// below see the same float32 scales and mins as with float32 tensors.
// Two arrangements of the same blocks (quant/tiles.py: tile_rows):
//   row-major: codes (N, row_bytes), scales (N, nb), nb = K / bs: row n's block b at
//              n * row_bytes + b * bpb (bpb: the bytes of one block's codes);
//   row tiles of T rows: codes (N/T, nb, T * bpb), scales (N/T, nb, T) (Q4_K's heads
//              (N/T, K/256, T, 16)): the blocks b of rows
//              nT .. nT + T - 1 lie side by side, so R = T rows read one sequential stream
//              (as ggml's repacked q4_0x8 / q8_0x8 layouts): on an AMD Zen 4, a 262144 x 640 Q8_0
//              product read 7.5 GB/s on one core from row-major streams, 11.6 GB/s from one.
//              5-bit codes in row tiles may be bit fields instead (see "5-bit codes in row
//              tiles" below; quant/fields.py): codes (N/T, W, T * 32), W words of 32 B per row.
//
// Numerics: with a min (Q4_1, Q5_1, Q4_K), each weight is rebuilt in registers as
// fmaf(scale, code, min), which equals the float32 value gguf.quants.dequantize computes
// (scale*code is exact in float32 for every supported format, so one rounding either way);
// activations stay float32; only the summation order differs from a float32 F.linear on the
// dequantized matrix. Without a min (Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS; Q6_K's blocks of 16
// excepted) a block sums s_b * (x . q)_b, q the signed (or centred, or table) codes: one
// multiply by s_b per 32 products instead of one per weight, the same sum rounded differently
// (tests/quant/test_quant.py's float32 bound holds).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// 4-bit codes valued through IQ4's table (ggml-common.h kvalues_iq4nl, gguf-py's
// IQ4_NL.kvalues): code q is KVALUES[q], d * KVALUES[q] exact in float32 (11 x 7 bits; IQ4_XS's
// d*(sc - 32) x 7: 24 bits), as gguf.quants computes it.
constexpr int TABLE4 = 14;
alignas(16) constexpr int8_t KVALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Bytes of one block's codes, and of one row of K codes, in each code layout.
// Field codes (bits 6: Q6_K, 3: Q3_K, 2: Q2_K): code blocks of 64 values, `bits` bytes per 8.
constexpr bool is_field(int bits) { return bits == 6 || bits == 3 || bits == 2; }
constexpr int64_t block_bytes(int bits, int64_t bs) {
  return bits == 8 ? bs : bits == 5 ? 20 : is_field(bits) ? 8 * bits : 16;  // 4, TABLE4: 16
}
constexpr int64_t row_bytes_of(int bits, int64_t K) {
  return bits == 8 ? K : bits == 5 ? K / 32 * 20 : is_field(bits) ? K / 64 * 8 * bits : K / 2;
}
// Values per scale: a code block's (BS), except field codes' blocks of 64, scaled per 16.
constexpr int64_t scale_block(int bits, int64_t bs) { return is_field(bits) ? 16 : bs; }

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian on x86, as ggml writes qh
  return v;
}

inline float to_f(float v) { return v; }
#if defined(__F16C__)
inline float to_f(at::Half v) { return _cvtsh_ss(v.x); }  // one instruction, not c10's bit code
#else
inline float to_f(at::Half v) { return static_cast<float>(v); }
#endif

// Where the blocks of a group of rows lie, relative to its first row's block 0: row r's block b
// at codes + r * crs + b * cbs (bytes), its scale and min at r * srs + b * sbs (elements).
struct Steps {
  int64_t crs, cbs, srs, sbs;
};

// The arrangement of a (N, K) weight: T rows per tile (1: row-major).
struct Arrangement {
  int64_t T, bpb, row_bytes, nb;
  // offsets of row n's block 0 (codes: bytes; scales: elements)
  int64_t code_at(int64_t n) const { return (n - n % T) * row_bytes + n % T * bpb; }
  int64_t scale_at(int64_t n) const { return (n - n % T) * nb + n % T; }
  // steps between the rows of one tile (row-major: between any rows) and between blocks
  Steps steps() const {
    return T == 1 ? Steps{row_bytes, bpb, nb, 1} : Steps{bpb, T * bpb, 1, T};
  }
};

// Field codes (bits = 6, 3 or 2 above, W = bits). Q6_K's and Q3_K's codes are centred: they are
// read as int8 (q - c) * 2^(8 - W) = (q << (8 - W)) ^ 0x80, c = 2^(W - 1) (32 or 4), and
// multiplied by d * sc * 2^-(8 - W) (field_unit, expand_head6 / expand_head3), which gives
// d * sc * (q - c) exactly. Q2_K's (with mins) are not: read as q, 0 .. 3, in the byte's low bits,
// rebuilt as fmaf(d * sc, q, -(dmin * m)) (expand_head2), as the reference rounds once.
// AVX-512 VBMI (field_reg): vpermb puts the W bytes of codes 8k .. 8k + 7 in qword k,
// vpmultishiftqb moves code i's field to bits s .. s + W - 1 of byte i (s = field_shift: 8 - W
// centred, else 0), and one ternary-logic operation does & mask, ^ 0x80 (centred). `more`:
// whether more bytes follow the block in the tensor (any block but a row's last), so that one
// 64-byte (W = 6) or 32-byte (W = 3, 2) load may read them (a masked load of 48 made a cached
// product ~5 % slower). Else BMI2's pdep deposits 8 fields into bits s .. s + W - 1 of 8 bytes
// (fast on Intel and AMD since Zen 3; correct, slow, on Zen 1-2), or plain shifts.
constexpr bool field_centred(int W) { return W != 2; }
constexpr int field_shift(int W) { return field_centred(W) ? 8 - W : 0; }
constexpr uint8_t field_mask(int W) { return static_cast<uint8_t>(((1 << W) - 1) << field_shift(W)); }
constexpr uint8_t field_xor(int W) { return field_centred(W) ? 0x80 : 0; }

#if defined(__AVX512VBMI__)
// The multishift selector: byte i of every qword reads the 8 bits from W*i - shift (mod 64).
constexpr uint64_t field_at(int W) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t((W * i - field_shift(W)) & 63) << (8 * i);
  return v;
}

// The 64 codes of a field block as int8 (q - c) * 2^(8 - W) (centred) or q, in one register.
template <int W>
inline __m512i field_reg(const uint8_t* blk, bool more) {
  auto pos = [](int k) { return int64_t(W * k) * 0x0101010101010101LL + 0x0706050403020100LL; };
  const __m512i from = _mm512_set_epi64(pos(7), pos(6), pos(5), pos(4), pos(3), pos(2), pos(1),
                                        pos(0));  // byte 8k + b <- byte Wk + b
  __m512i raw;
  if (more) {  // a plain load (a conditional one compiled to a masked load on every block: ~5 %)
    raw = W == 6 ? _mm512_loadu_si512(blk)
                 : _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
  } else {
    alignas(64) uint8_t tail[64] = {};
    std::memcpy(tail, blk, 8 * W);
    raw = _mm512_load_si512(tail);
  }
  const __m512i c = _mm512_multishift_epi64_epi8(_mm512_set1_epi64(static_cast<int64_t>(field_at(W))),
                                                 _mm512_permutexvar_epi8(from, raw));
  return _mm512_ternarylogic_epi32(c, _mm512_set1_epi8(static_cast<char>(field_mask(W))),
                                   _mm512_set1_epi8(static_cast<char>(field_xor(W))),
                                   0x6A);  // (A & B) ^ C
}

// Codes 16h .. 16h + 15 of field_reg's register as float32 (q - c) * 2^(32 - W) (centred) or
// q * 2^24: one vpermb puts byte 16h + l in the top byte of lane l and zeroes the rest (an exact
// int32), then one conversion. Against sign-extending each 16 bytes (vextracti32x4 + vpmovsxbd)
// this frees a shuffle per 16 values: a cached 896 x 4864 Q6_K product took ~0.87x the time.
inline __m512 field_dwords(__m512i c, int h) {
  const __m512i at = _mm512_add_epi32(
      _mm512_set_epi32(15 << 24, 14 << 24, 13 << 24, 12 << 24, 11 << 24, 10 << 24, 9 << 24,
                       8 << 24, 7 << 24, 6 << 24, 5 << 24, 4 << 24, 3 << 24, 2 << 24, 1 << 24, 0),
      _mm512_set1_epi32((16 * h) << 24));
  return _mm512_cvtepi32_ps(_mm512_maskz_permutexvar_epi8(0x8888888888888888ULL, at, c));
}

// What field codes are multiplied by: d * sc * field_unit(W), the codes read as field_dwords'.
// Exact: d * sc stays normal (>= 2^-53).
constexpr float field_unit(int W) {
  return 1.0f / static_cast<float>(1ULL << (24 + field_shift(W)));
}
constexpr float FIELD_INT8_TO_UNIT = 0x1p24f;  // unpack_fields' int8 codes, read as field_dwords'
#else
// Elsewhere the codes are unpack_fields' int8: scales d * sc * 2^-(8 - W) (centred) or d * sc.
constexpr float field_unit(int W) { return 1.0f / static_cast<float>(1 << field_shift(W)); }
constexpr float FIELD_INT8_TO_UNIT = 1.0f;
#endif

// The 64 codes of a field block as int8 (q - c) * 2^(8 - W) (centred) or q into q[0..63]
// (64-byte aligned).
template <int W>
inline void unpack_fields(const uint8_t* blk, int8_t* q, bool more) {
#if defined(__AVX512VBMI__)
  _mm512_store_si512(q, field_reg<W>(blk, more));
#elif defined(__BMI2__)
  (void)more;
  constexpr uint64_t mask = 0x0101010101010101ULL * field_mask(W);
  constexpr uint64_t flip = 0x0101010101010101ULL * field_xor(W);
  for (int k = 0; k < 8; ++k) {
    uint64_t v = 0;
    std::memcpy(&v, blk + W * k, W);
    const uint64_t c = _pdep_u64(v, mask) ^ flip;
    std::memcpy(q + 8 * k, &c, 8);
  }
#else
  (void)more;
  for (int j = 0; j < 64; ++j) {
    const int o = W * j;
    int v = blk[o >> 3] >> (o & 7);
    if ((o & 7) + W > 8) v |= blk[(o >> 3) + 1] << (8 - (o & 7));
    q[j] = static_cast<int8_t>(((v & ((1 << W) - 1)) << field_shift(W)) ^ field_xor(W));
  }
#endif
}

// Scalar reference: dequantize one row into out[K].
template <int BITS, int BS, typename S>
void dequant_row(const uint8_t* codes, const S* sc, const S* mn, const Steps& L, int64_t K,
                 float* out) {
  if constexpr (is_field(BITS)) {  // fmaf(d * sc * unit, (q - c) / unit, min or 0): exact or
    alignas(64) int8_t q[64];       // rounded once (Q2_K's min)
    for (int64_t b = 0; b < K / 64; ++b) {
      unpack_fields<BITS>(codes + b * L.cbs, q, b + 1 < K / 64);
      for (int64_t j = 0; j < 64; ++j) {
        const float f = float(q[j]) * FIELD_INT8_TO_UNIT;  // (q - c) / field_unit: exact
        const int64_t at = (4 * b + j / 16) * L.sbs;
        out[b * 64 + j] = std::fmaf(to_f(sc[at]), f, BITS == 2 ? to_f(mn[at]) : 0.0f);
      }
    }
    return;
  }
  for (int64_t b = 0; b < K / BS; ++b) {
    const uint8_t* blk = codes + b * L.cbs;
    const float s = to_f(sc[b * L.sbs]);
    const float m = mn ? to_f(mn[b * L.sbs]) : 0.0f;
    for (int64_t j = 0; j < BS; ++j) {
      float q;
      if (BITS == 8) {
        q = static_cast<float>(reinterpret_cast<const int8_t*>(blk)[j]);
      } else {
        const uint8_t byte = blk[j & 15];
        int code = j < 16 ? (byte & 0x0F) : (byte >> 4);
        if (BITS == 5) code |= ((load_u32(blk + 16) >> j) & 1) << 4;
        if (BITS == TABLE4) {
          code = KVALUES[code];
        } else if (!mn) {
          code -= BITS == 4 ? 8 : 16;  // centred codes (ggml's Q4_0 / Q5_0)
        }
        q = static_cast<float>(code);
      }
      out[b * BS + j] = std::fmaf(s, q, m);
    }
  }
}

// Software prefetch: a decode step streams every weight once and the hardware prefetcher alone
// leaves the loop waiting on memory, so each row's codes are requested PF_BYTES ahead of the
// read (one prefetch per 64-byte line) and each band's scales / mins one band ahead. PF_BYTES
// 512 / 2048 / 8192 / 16384 gave 1.14 / 1.31-1.56 / 1.44-1.70 / 1.46-1.69x on the three GGUFs.
constexpr int64_t PF_BYTES = 8192;

inline void prefetch_range(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

// Loops over rows, x rows and 8-value groups unroll fully: the accumulators are an array whose
// every index must be a constant for it to live in registers.
#define UNROLL _Pragma("GCC unroll 8")

// Blocks 0 .. nb - 1 in pairs: block(b, slot) with slot an integral constant, 0 for even blocks
// and 1 for odd ones, so that the accumulator a block adds into is indexed by a compile-time
// constant and stays in a register (an index b & 1 kept the accumulators on the stack).
template <typename Block>
inline void blocks_in_pairs(int64_t nb, Block&& block) {
  using std::integral_constant;
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    block(b, integral_constant<int, 0>{});
    block(b + 1, integral_constant<int, 1>{});
  }
  if (b < nb) block(b, integral_constant<int, 0>{});
}

#if defined(__AVX2__)
// The sum of a vector's 8 lanes.
inline float reduce8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// The passes of the AVX2 products over all M rows of x against R weight rows: tiles of 4, 2, 1
// rows of x (MC), each against R / P passes of P weight rows (at most 8 accumulators of the 16
// registers: P = 4 / MC rows); pass(MC, P, m) as integral constants and the tile's first row.
// WIDE: one x row against all R rows at once (16 accumulators, some on the stack): Q8_0, whose
// loop is the lightest, read the 151936 x 896 head of Qwen2.5 in 5.4 ms instead of 6.5 (two
// threads; its other formats were 3-10 % slower so). A row's sum is the same whatever P is.
template <int R, bool WIDE = false, typename Pass>
void x_row_tiles(int64_t M, Pass&& pass) {
  using std::integral_constant;
  constexpr int P2 = R < 2 ? R : 2, P1 = WIDE ? R : R < 4 ? R : 4;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) pass(integral_constant<int, 4>{}, integral_constant<int, 1>{}, m);
  for (; m + 2 <= M; m += 2) pass(integral_constant<int, 2>{}, integral_constant<int, P2>{}, m);
  for (; m < M; ++m) pass(integral_constant<int, 1>{}, integral_constant<int, P1>{}, m);
}
#endif

#if defined(__AVX512F__)
// IQ4's table as 16 float32 lanes (exact: small integers).
inline __m512 kvalues16() {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(KVALUES))));
}

// The 16 codes of half `h` (values 16h .. 16h + 15) of the block at `blk`, as float32 (minus
// `centre`: 8 or 16 for the centred 4/5-bit codes of a weight without mins, else 0).
template <int BITS>
inline __m512 load16(const uint8_t* blk, int h, float centre = 0.0f) {
  if (BITS == 8) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * h));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
  }
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
  if (h) v = _mm_srli_epi16(v, 4);
  v = _mm_and_si128(v, _mm_set1_epi8(0x0F));
  __m512i q = _mm512_cvtepu8_epi32(v);
  if (BITS == 5) {  // the fifth bit: one masked add of 16 per 16 codes
    const uint32_t qh = load_u32(blk + 16);
    const __mmask16 hi = static_cast<__mmask16>(h ? (qh >> 16) : (qh & 0xFFFF));
    q = _mm512_mask_add_epi32(q, hi, q, _mm512_set1_epi32(16));
  }
  if (BITS == TABLE4) return _mm512_permutexvar_ps(q, kvalues16());  // KVALUES[q]
  return _mm512_sub_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(centre));  // exact: small integers
}

// The centred codes (code - 8 or code - 16) of the 4/5-bit block at `blk` as float32: values
// 0 .. 15 in q0, 16 .. 31 in q1. The 16 possible low nibbles are looked up in a table of
// floats (vpermps reads an index's low 4 bits, so the byte's high nibble needs no mask) and the
// fifth bit adds 16 under a mask: 6 vector operations per 32 codes, no int->float conversion.
// TABLE4 (IQ4_NL, IQ4_XS) looks its codes up in IQ4's table instead: the same operations, so
// those formats read at Q4_0's speed.
template <int BITS>
inline void centred32(const uint8_t* blk, __m512& q0, __m512& q1) {
  constexpr float c = BITS == 4 ? 8.0f : 16.0f;
  const __m512 table =
      BITS == TABLE4 ? kvalues16()
                     : _mm512_set_ps(15 - c, 14 - c, 13 - c, 12 - c, 11 - c, 10 - c, 9 - c, 8 - c,
                                     7 - c, 6 - c, 5 - c, 4 - c, 3 - c, 2 - c, 1 - c, 0 - c);
  // lane j: byte j of the block = code j (low nibble) and code j + 16 (high nibble)
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
  q0 = _mm512_permutexvar_ps(v, table);
  q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
  if (BITS == 5) {  // bit j of the little-endian qh word: bit 4 of code j
    const uint32_t qh = load_u32(blk + 16);
    const __m512 sixteen = _mm512_set1_ps(16.0f);
    q0 = _mm512_mask_add_ps(q0, static_cast<__mmask16>(qh & 0xFFFF), q0, sixteen);
    q1 = _mm512_mask_add_ps(q1, static_cast<__mmask16>(qh >> 16), q1, sixteen);
  }
}

// The weights fmaf(s, code, m) of the block at `blk`: values 0 .. 15 in w0, 16 .. 31 in w1.
// 4/5-bit codes: the 16 (32) weights a block can hold are built once as a table
// T[q] = fmaf(s, q, m) and each weight is a lookup in it (vpermps reads the code's low 4 bits;
// vpermt2ps 5 bits): the same float32 values as one FMA per weight, with no nibble mask and no
// int->float conversion per 16 codes (4 instead of 7 vector operations per 16 weights).
template <int BITS, int BS>
inline void block_weights(const uint8_t* blk, __m512 s, __m512 m, __m512& w0, __m512& w1) {
  if constexpr (BITS == 8) {
    w0 = w1 = _mm512_fmadd_ps(s, load16<8>(blk, 0), m);
    if (BS == 32) w1 = _mm512_fmadd_ps(s, load16<8>(blk, 1), m);
  } else {
    const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    // lane j: byte j of the block = code j (low nibble) and code j + 16 (high nibble)
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
    const __m512 t0 = _mm512_fmadd_ps(s, BITS == TABLE4 ? kvalues16() : iota, m);  // T[0 .. 15]
    if constexpr (BITS == 4 || BITS == TABLE4) {
      w0 = _mm512_permutexvar_ps(c, t0);  // vpermps ignores index bits above 3
      w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), t0);
    } else {
      const __m512 t1 = _mm512_fmadd_ps(s, _mm512_add_ps(iota, _mm512_set1_ps(16.0f)), m);
      const uint32_t qh = load_u32(blk + 16);  // bit j: bit 4 of code j
      const __m512i b4 = _mm512_set1_epi32(16);
      __m512i lo = _mm512_and_si512(c, _mm512_set1_epi32(15));
      __m512i hi = _mm512_srli_epi32(c, 4);
      lo = _mm512_mask_or_epi32(lo, static_cast<__mmask16>(qh & 0xFFFF), lo, b4);
      hi = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(qh >> 16), hi, b4);
      w0 = _mm512_permutex2var_ps(t0, lo, t1);  // index bit 4 picks T[16 .. 31]
      w1 = _mm512_permutex2var_ps(t0, hi, t1);
    }
  }
}

// y[m, r] = sum_k x[m, k] * W[r, k] for MC rows of x and R weight rows, whose block b lies at
// codes + r * L.crs + b * L.cbs (scales at sc + r * L.srs + b * L.sbs).
// Each block's weights are built once and used for all MC rows of x; R rows at once share the x
// loads. Every (m, r) pair sums in the same order whatever R, MC and the layout are (two
// accumulators of 16 lanes), so a row's result does not depend on how many rows are computed
// with it, nor on whether its rows are tiled.
// BS (block size, 16 or 32), R and MC are template arguments so the loops fully unroll.
template <int BITS, int BS, int R, int MC>
void dot_tile(const float* x, int64_t ldx, const uint8_t* codes, const float* sc, const float* mn,
              const Steps& L, int64_t K, bool pf, float* y, int64_t ldy) {
  __m512 acc[MC][R][2];
  UNROLL
  for (int i = 0; i < MC; ++i) {
    UNROLL
    for (int r = 0; r < R; ++r) acc[i][r][0] = acc[i][r][1] = _mm512_setzero_ps();
  }
  constexpr int64_t bpb = block_bytes(BITS, BS);
  // slot o: even blocks into accumulator 0, odd into 1 (blocks_in_pairs)
  auto block = [&](int64_t b, auto slot) {
    constexpr int o = decltype(slot)::value;
    const int64_t e = b * BS;
    if (pf) {  // one prefetch per 64-byte line, PF_BYTES ahead in each row's stream
      UNROLL
      for (int r = 0; r < R; ++r) {
        const int64_t off = r * L.crs + b * L.cbs;
        if ((off & 63) < bpb) _mm_prefetch(codes + off + PF_BYTES, _MM_HINT_T0);
      }
    }
    UNROLL
    for (int r = 0; r < R; ++r) {
      if constexpr (is_field(BITS)) {  // 64 codes, then 4 x 16 weights as int8 codes gave
#if defined(__AVX512VBMI__)
        const __m512i c = field_reg<BITS>(codes + r * L.crs + b * L.cbs, b + 1 < K / 64);
#else
        alignas(64) int8_t q[64];
        unpack_fields<BITS>(codes + r * L.crs + b * L.cbs, q, b + 1 < K / 64);
#endif
        UNROLL
        for (int h = 0; h < 4; ++h) {  // expanded heads: scale steps (nb, 1), L.sbs = 1
          const __m512 s = _mm512_set1_ps(sc[r * L.srs + 4 * b + h]);
#if defined(__AVX512VBMI__)
          const __m512 qf = field_dwords(c, h);
#else
          const __m512 qf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
              _mm_load_si128(reinterpret_cast<const __m128i*>(q + 16 * h))));
#endif
          const __m512 m = BITS == 2 ? _mm512_set1_ps(mn[r * L.srs + 4 * b + h])  // Q2_K's min
                                     : _mm512_setzero_ps();
          const __m512 w = _mm512_fmadd_ps(s, qf, m);
          UNROLL
          for (int i = 0; i < MC; ++i) {  // one accumulator, as blocks of 16 int8 codes
            acc[i][r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + e + 16 * h), w,
                                           acc[i][r][0]);
          }
        }
        continue;
      }
      const __m512 s = _mm512_set1_ps(sc[r * L.srs + b * L.sbs]);
      const uint8_t* blk = codes + r * L.crs + b * L.cbs;
      if (BS == 32 && !mn) {  // s * (x . q): one multiply by s per block
        __m512 q0, q1;
        if constexpr (BITS == 8) {
          q0 = load16<8>(blk, 0), q1 = load16<8>(blk, 1);
        } else {
          centred32<BITS>(blk, q0, q1);
        }
        UNROLL
        for (int i = 0; i < MC; ++i) {
          const float* xi = x + i * ldx + e;
          const __m512 t = _mm512_fmadd_ps(_mm512_loadu_ps(xi + 16), q1,
                                           _mm512_mul_ps(_mm512_loadu_ps(xi), q0));
          acc[i][r][o] = _mm512_fmadd_ps(s, t, acc[i][r][o]);
        }
        continue;
      }
      __m512 w0, w1;
      block_weights<BITS, BS>(blk, s, _mm512_set1_ps(mn ? mn[r * L.srs + b * L.sbs] : 0.0f), w0,
                              w1);
      UNROLL
      for (int i = 0; i < MC; ++i) {
        const float* xi = x + i * ldx + e;
        acc[i][r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(xi), w0, acc[i][r][0]);
        if (BS == 32) acc[i][r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(xi + 16), w1, acc[i][r][1]);
      }
    }
  };
  blocks_in_pairs(K / BS, block);
  UNROLL
  for (int i = 0; i < MC; ++i) {
    UNROLL
    for (int r = 0; r < R; ++r) {
      y[i * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][r][0], acc[i][r][1]));
    }
  }
}

// All M rows of x against R weight rows: tiles of 4, 2, 1 rows of x, each against R / P passes
// of P weight rows (at most 16 accumulators: P = 8 / MC rows). The codes are prefetched on the
// first tile only (later tiles find them in cache).
template <int BITS, int BS, int R>
void dot_rows(const float* x, int64_t M, int64_t ldx, const uint8_t* codes, const float* sc,
              const float* mn, const Steps& L, int64_t K, float* y, int64_t ldy) {
  constexpr int P4 = R < 2 ? R : 2, P2 = R < 4 ? R : 4, P1 = R < 8 ? R : 8;
  auto pass = [&](auto mc, auto p, int64_t m) {
    constexpr int MC = decltype(mc)::value, P = decltype(p)::value;
    for (int r = 0; r < R; r += P) {
      dot_tile<BITS, BS, P, MC>(x + m * ldx, ldx, codes + r * L.crs, sc + r * L.srs,
                                mn ? mn + r * L.srs : nullptr, L, K, m == 0, y + m * ldy + r, ldy);
    }
  };
  using std::integral_constant;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) pass(integral_constant<int, 4>{}, integral_constant<int, P4>{}, m);
  for (; m + 2 <= M; m += 2) pass(integral_constant<int, 2>{}, integral_constant<int, P2>{}, m);
  for (; m < M; ++m) pass(integral_constant<int, 1>{}, integral_constant<int, P1>{}, m);
}

// One row of the dequantized weight (same FMA as dequant_row).
template <int BITS, int BS, typename S>
void dequant_row_fast(const uint8_t* codes, const S* sc, const S* mn, const Steps& L, int64_t K,
                      float* out) {
  if constexpr (is_field(BITS)) {
#if defined(__AVX512VBMI__)
    for (int64_t b = 0; b < K / 64; ++b) {
      const __m512i c = field_reg<BITS>(codes + b * L.cbs, b + 1 < K / 64);
      for (int h = 0; h < 4; ++h) {
        const __m512 s = _mm512_set1_ps(to_f(sc[(4 * b + h) * L.sbs]));
        const __m512 m = _mm512_set1_ps(BITS == 2 ? to_f(mn[(4 * b + h) * L.sbs]) : 0.0f);
        _mm512_storeu_ps(out + b * 64 + 16 * h, _mm512_fmadd_ps(s, field_dwords(c, h), m));
      }
    }
#else
    dequant_row<BITS, BS, S>(codes, sc, mn, L, K, out);  // the same fmaf per value
#endif
    return;
  }
  const float centre = (BITS == 8 || mn) ? 0.0f : BITS == 4 ? 8.0f : 16.0f;
  for (int64_t b = 0; b < K / BS; ++b) {
    const __m512 s = _mm512_set1_ps(to_f(sc[b * L.sbs]));
    const __m512 mm = _mm512_set1_ps(mn ? to_f(mn[b * L.sbs]) : 0.0f);
    for (int h = 0; h < BS / 16; ++h) {
      const __m512 q = load16<BITS>(codes + b * L.cbs, h, centre);
      _mm512_storeu_ps(out + b * BS + 16 * h, _mm512_fmadd_ps(s, q, mm));
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 + FMA (8 float lanes, 16 registers: Intel since Haswell, AMD since Zen 1, without AVX-512):
// the same products as the AVX-512 path with half-width vectors. A block's 32 codes become four
// vectors of 8 floats, converted exactly from 32-bit integers: 8-bit codes sign-extended, 4/5-bit
// codes one per lane (see BlockCodes). Weights with a min are rebuilt as
// fmaf(s, q, m), blocks without one sum s * (x . q) as above.

// The codes of the block at `blk`, read once; code(j) gives codes 8j .. 8j + 7 as 8 floats, built
// when they are used (a product holds one such vector at a time, not BS / 8, and the 16
// registers keep its accumulators). 8-bit codes are sign-extended bytes. 4/5-bit codes: byte i
// holds code i (low nibble) and code i + 16 (high nibble), so each of the 16 bytes is
// zero-extended once into a 32-bit lane (b0: bytes 0 .. 7, b1: bytes 8 .. 15) and a code is then
// one mask (codes 0 .. 15) or one shift (codes 16 .. 31) away. The fifth bit of code i is bit i
// of the little-endian qh word: a variable shift moves it to bit 4 of lane i. CENTRE (8 or 16 for
// the centred codes of a weight without mins, else 0) is subtracted as an integer, so every value
// converts exactly (-16 .. 31).
template <int BITS, int CENTRE>
struct BlockCodes {
  const uint8_t* blk;
  __m256i b0, b1;  // 4/5-bit blocks: bytes 0 .. 7 and 8 .. 15, one per 32-bit lane
  __m256i hA, hB;  // 5-bit blocks: qh << 4 and qh >> 12 in every lane
  __m128i v0, v1;  // TABLE4: KVALUES of codes 0 .. 15 and 16 .. 31, one int8 per byte
  explicit BlockCodes(const uint8_t* p) : blk(p) {
    if constexpr (BITS == TABLE4) {  // 16 table lookups at once (pshufb on the int8 table)
      const __m128i table = _mm_load_si128(reinterpret_cast<const __m128i*>(KVALUES));
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m128i low = _mm_set1_epi8(0x0F);
      v0 = _mm_shuffle_epi8(table, _mm_and_si128(v, low));
      v1 = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(v, 4), low));
    } else if constexpr (BITS != 8) {
      b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
      b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
      if constexpr (BITS == 5) {
        const uint32_t qh = load_u32(p + 16);
        hA = _mm256_set1_epi32(static_cast<int>(qh << 4));   // bit i at 4 + i (codes 0 .. 15)
        hB = _mm256_set1_epi32(static_cast<int>(qh >> 12));  // bit i at i - 12 (codes 16 .. 31)
      }
    }
  }
  __m256 code(int j) const {
    if constexpr (BITS == 8) {
      const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 8 * j));
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    } else if constexpr (BITS == TABLE4) {  // codes 8j .. 8j + 7: half j % 2 of v0 or v1
      const __m128i v = j < 2 ? v0 : v1;
      return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(j % 2 ? _mm_srli_si128(v, 8) : v));
    } else {
      const __m256i b = j % 2 ? b1 : b0;
      __m256i q = j < 2 ? _mm256_and_si256(b, _mm256_set1_epi32(15)) : _mm256_srli_epi32(b, 4);
      if constexpr (BITS == 5) {  // lane l of group j: code 8j + l, its bit at 4 + l + 8 (j % 2)
        const __m256i shift = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                               _mm256_set1_epi32(j % 2 ? 8 : 0));
        const __m256i h = _mm256_srlv_epi32(j < 2 ? hA : hB, shift);
        q = _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi32(16)));
      }
      if constexpr (CENTRE != 0) q = _mm256_sub_epi32(q, _mm256_set1_epi32(CENTRE));
      return _mm256_cvtepi32_ps(q);
    }
  }
};

// As the AVX-512 dot_tile: y[m, r] for MC rows of x and R weight rows, two accumulators of 8
// lanes per pair, summed in the same order whatever R, MC and the layout are. MIN: the weight has
// mins (else it is summed as s * (x . q) where BS = 32). Every accumulator index is a compile-time
// constant (blocks in pairs: even ones into slot 0, odd ones into slot 1), so the accumulators
// stay in registers: an index b & 1 kept them on the stack (a load and a store per FMA).
template <int BITS, int BS, int R, int MC, bool MIN>
void dot_tile(const float* x, int64_t ldx, const uint8_t* codes, const float* sc, const float* mn,
              const Steps& L, int64_t K, bool pf, float* y, int64_t ldy) {
  __m256 acc[MC][R][2];
  UNROLL
  for (int i = 0; i < MC; ++i) {
    UNROLL
    for (int r = 0; r < R; ++r) acc[i][r][0] = acc[i][r][1] = _mm256_setzero_ps();
  }
  constexpr int64_t bpb = block_bytes(BITS, BS);
  constexpr int centre = (BITS == 8 || MIN) ? 0 : BITS == 4 ? 8 : 16;
  auto block = [&](int64_t b, auto slot) {
    constexpr int o = decltype(slot)::value;  // 0: even block, 1: odd block
    const int64_t e = b * BS;
    if (pf) {  // one prefetch per 64-byte line, PF_BYTES ahead in each row's stream
      UNROLL
      for (int r = 0; r < R; ++r) {
        const int64_t off = r * L.crs + b * L.cbs;
        if ((off & 63) < bpb) _mm_prefetch(codes + off + PF_BYTES, _MM_HINT_T0);
      }
    }
    UNROLL
    for (int r = 0; r < R; ++r) {
      if constexpr (is_field(BITS)) {  // 64 int8 codes, then 8 x 8 as int8 codes were read
        alignas(64) int8_t q[64];
        unpack_fields<BITS>(codes + r * L.crs + b * L.cbs, q, b + 1 < K / 64);
        UNROLL
        for (int j = 0; j < 8; ++j) {
          const int64_t at = r * L.srs + (4 * b + j / 2) * L.sbs;
          const __m256 s = _mm256_set1_ps(sc[at]);
          const __m256 m = _mm256_set1_ps(BITS == 2 ? mn[at] : 0.0f);  // Q2_K's min
          const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * j));
          const __m256 w = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), m);
          UNROLL
          for (int i = 0; i < MC; ++i) {  // blocks of 16: 8 values into each accumulator
            const __m256 xv = _mm256_loadu_ps(x + i * ldx + e + 8 * j);
            acc[i][r][j & 1] = _mm256_fmadd_ps(xv, w, acc[i][r][j & 1]);
          }
        }
        continue;
      }
      const __m256 s = _mm256_set1_ps(sc[r * L.srs + b * L.sbs]);
      const BlockCodes<BITS, centre> c(codes + r * L.crs + b * L.cbs);
      if constexpr (BS == 32 && !MIN) {  // s * (x . q): one multiply by s per block
        __m256 t[MC];
        UNROLL
        for (int j = 0; j < BS / 8; ++j) {
          const __m256 q = c.code(j);
          UNROLL
          for (int i = 0; i < MC; ++i) {
            const __m256 xv = _mm256_loadu_ps(x + i * ldx + e + 8 * j);
            t[i] = j == 0 ? _mm256_mul_ps(xv, q) : _mm256_fmadd_ps(xv, q, t[i]);
          }
        }
        UNROLL
        for (int i = 0; i < MC; ++i) acc[i][r][o] = _mm256_fmadd_ps(s, t[i], acc[i][r][o]);
      } else {
        const __m256 m = _mm256_set1_ps(MIN ? mn[r * L.srs + b * L.sbs] : 0.0f);
        UNROLL
        for (int j = 0; j < BS / 8; ++j) {
          const __m256 w = _mm256_fmadd_ps(s, c.code(j), m);  // 8 weights
          UNROLL
          for (int i = 0; i < MC; ++i) {
            const __m256 xv = _mm256_loadu_ps(x + i * ldx + e + 8 * j);
            acc[i][r][j & 1] = _mm256_fmadd_ps(xv, w, acc[i][r][j & 1]);
          }
        }
      }
    }
  };
  blocks_in_pairs(K / BS, block);
  UNROLL
  for (int i = 0; i < MC; ++i) {
    UNROLL
    for (int r = 0; r < R; ++r) y[i * ldy + r] = reduce8(_mm256_add_ps(acc[i][r][0], acc[i][r][1]));
  }
}

// All M rows of x against R weight rows, in x_row_tiles' passes.
template <int BITS, int BS, int R>
void dot_rows(const float* x, int64_t M, int64_t ldx, const uint8_t* codes, const float* sc,
              const float* mn, const Steps& L, int64_t K, float* y, int64_t ldy) {
  x_row_tiles<R, BITS == 8 && BS == 32>(M, [&](auto mc, auto p, int64_t m) {
    constexpr int MC = decltype(mc)::value, P = decltype(p)::value;
    for (int r = 0; r < R; r += P) {
      if (mn) {
        dot_tile<BITS, BS, P, MC, true>(x + m * ldx, ldx, codes + r * L.crs, sc + r * L.srs,
                                        mn + r * L.srs, L, K, m == 0, y + m * ldy + r, ldy);
      } else {
        dot_tile<BITS, BS, P, MC, false>(x + m * ldx, ldx, codes + r * L.crs, sc + r * L.srs,
                                         nullptr, L, K, m == 0, y + m * ldy + r, ldy);
      }
    }
  });
}

// One row of the dequantized weight (same FMA as dequant_row).
template <int BITS, int BS, typename S>
void dequant_row_fast(const uint8_t* codes, const S* sc, const S* mn, const Steps& L, int64_t K,
                      float* out) {
  if constexpr (is_field(BITS)) {
    dequant_row<BITS, BS, S>(codes, sc, mn, L, K, out);  // the same fmaf per value
    return;
  }
  for (int64_t b = 0; b < K / BS; ++b) {
    const __m256 s = _mm256_set1_ps(to_f(sc[b * L.sbs]));
    const __m256 m = _mm256_set1_ps(mn ? to_f(mn[b * L.sbs]) : 0.0f);
    auto store = [&](auto c) {
      for (int j = 0; j < BS / 8; ++j) {
        _mm256_storeu_ps(out + b * BS + 8 * j, _mm256_fmadd_ps(s, c.code(j), m));
      }
    };
    if (BITS == 8 || mn) {
      store(BlockCodes<BITS, 0>(codes + b * L.cbs));
    } else {
      store(BlockCodes<BITS, BITS == 4 ? 8 : 16>(codes + b * L.cbs));
    }
  }
}
#else
template <int BITS, int BS, int R>
void dot_rows(const float* x, int64_t M, int64_t ldx, const uint8_t* codes, const float* sc,
              const float* mn, const Steps& L, int64_t K, float* y, int64_t ldy) {
  std::vector<float> w(K);
  for (int r = 0; r < R; ++r) {
    dequant_row<BITS, BS, float>(codes + r * L.crs, sc + r * L.srs, mn ? mn + r * L.srs : nullptr,
                                 L, K, w.data());
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * ldx + k] * w[k];
      y[m * ldy + r] = acc;
    }
  }
}

template <int BITS, int BS, typename S>
void dequant_row_fast(const uint8_t* codes, const S* sc, const S* mn, const Steps& L, int64_t K,
                      float* out) {
  dequant_row<BITS, BS, S>(codes, sc, mn, L, K, out);
}
#endif

// ---- 5-bit codes in row tiles: bit fields (quant/fields.py) ----
// In row tiles a 5-bit weight is held as bit fields instead of ggml's nibbles + high-bit word:
// field f = 4b + j of a row holds codes 8j .. 8j + 7 of block b, code 8j + l in 32-bit lane l;
// a 32-byte word (8 uint32 lanes) holds six fields, field f in word f / 6 at bits
// p = 5 (f % 6) .. p + 4 of every lane; a row is W = ceil(4 nb / 6) words, and a tile's T rows
// lie word by word side by side (codes (N/T, W, T * 32)), so the word steps are Steps' block
// steps. A field is read as and(word, 31 << p): the code times 2^p, an exact int32 (minus
// 16 << p for centred codes: two's complement, still exact), converted exactly to float32
// and multiplied by x * 2^-p (xs: x scaled once per product; where that is not exact, see
// scalable_for_fields, the fields are shifted instead): the same float32 products
// x * (code - 16) as from ggml's layout, summed in the same order as the AVX2 and plain dot_tile
// (same lanes, same accumulators), so the results are bit-identical; AVX-512 builds sum ggml's
// blocks in 16 lanes and keep them (qgemv_fields_preferred). Four vector operations per 8 codes
// (and, sub, convert, FMA) instead of seven (the fifth bit's variable shift, mask and or): a
// 9728 x 896 Q5_0 product takes 0.64-0.69x the time on AVX2 (Zen 3).
constexpr int64_t fields_words(int64_t nb) { return (4 * nb + 5) / 6; }

// Whether a weight's codes are bit fields: 5-bit, row tiles (3-d codes), T * 32 bytes per tile
// word (ggml's blocks in tiles take T * 20).
bool is_fields(int64_t bits, int64_t T, const torch::Tensor& codes) {
  return bits == 5 && T > 1 && codes.dim() == 3 && codes.size(2) == T * 32;
}

// The arrangement of a (N, K) weight in tiles of T rows: blocks of ggml's codes, or words of
// bit fields (32 bytes each; fields).
template <int BITS, int BS>
Arrangement arrangement(int64_t T, int64_t K, bool fields) {
  const int64_t nb = K / BS;
  return fields ? Arrangement{T, 32, fields_words(nb) * 32, nb}
                : Arrangement{T, block_bytes(BITS, BS), row_bytes_of(BITS, K), nb};
}

// Whether x * 2^-p is exact for every value of x and every shift p <= 25: zero, not finite, or
// |x| >= 2^-101 (the result stays a normal float32). Activations of real models always are;
// where one is not (|x| < 2^-101), the product reads the fields with shifts instead (SHIFT).
bool scalable_for_fields(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a != 0.0f && a < 0x1p-101f) return false;  // (NaN compares false: fine as it is)
  }
  return true;
}

// xs = x with column k scaled by 2^-p, p = 5 ((k / 8) % 6) (the field its codes lie in).
void scale_for_fields(const float* x, int64_t M, int64_t K, float* xs) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      xs[m * K + k] = std::ldexp(x[m * K + k], -5 * static_cast<int>((k / 8) % 6));
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// The field at bits p .. p + 4 of every lane of the word v, minus `centre` (16 for centred
// codes, else 0), as 8 float32: the value itself (SHIFT) or times 2^p (and, subtract, convert:
// exact either way, see above).
template <bool SHIFT>
inline __m256 field_value(__m256i v, int p, int centre) {
  __m256i q = SHIFT ? _mm256_and_si256(_mm256_srli_epi32(v, p), _mm256_set1_epi32(31))
                    : _mm256_and_si256(v, _mm256_set1_epi32(31 << p));
  if (centre) q = _mm256_sub_epi32(q, _mm256_set1_epi32(SHIFT ? centre : centre << p));
  return _mm256_cvtepi32_ps(q);
}
#endif

// One row of the dequantized weight: fmaf(s, code (- 16 without mins), m), as dequant_row.
template <typename S>
void dequant_row_fields(const uint8_t* codes, const S* sc, const S* mn, const Steps& L,
                        int64_t nb, float* out) {
  const int centre = mn ? 0 : 16;
  for (int64_t b = 0; b < nb; ++b) {
    const float s = to_f(sc[b * L.sbs]);
    const float m = mn ? to_f(mn[b * L.sbs]) : 0.0f;
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t f = 4 * b + j;
      const uint8_t* word = codes + f / 6 * L.cbs;
      const int p = 5 * static_cast<int>(f % 6);
#if defined(__AVX2__) && defined(__FMA__)
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(word));
      _mm256_storeu_ps(out + 8 * f, _mm256_fmadd_ps(_mm256_set1_ps(s),
                                                    field_value<true>(v, p, centre),
                                                    _mm256_set1_ps(m)));
#else
      for (int l = 0; l < 8; ++l) {
        const int c = static_cast<int>((load_u32(word + 4 * l) >> p) & 31) - centre;
        out[8 * f + l] = std::fmaf(s, static_cast<float>(c), m);
      }
#endif
    }
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// As dot_tile (AVX2) for fields: y[m, r] for MC rows of xs (x scaled, see above) and R weight
// rows. Blocks are taken six at a time (four words), so each field's word and shift are
// compile-time constants; slot o (even / odd block) and the j & 1 accumulators as in dot_tile.
// SHIFT: xs is x itself and each field is shifted down to the code (one more operation per 8
// codes): the same products, for rows that cannot be scaled exactly (scalable_for_fields).
template <int R, int MC, bool MIN, bool SHIFT>
void dot_tile_fields(const float* xs, int64_t ldx, const uint8_t* codes, const float* sc,
                     const float* mn, const Steps& L, int64_t nb, bool pf, float* y,
                     int64_t ldy) {
  __m256 acc[MC][R][2];
  UNROLL
  for (int i = 0; i < MC; ++i) {
    UNROLL
    for (int r = 0; r < R; ++r) acc[i][r][0] = acc[i][r][1] = _mm256_setzero_ps();
  }
  auto block = [&](int64_t b, auto at) {
    constexpr int I = decltype(at)::value;  // b % 6: the block's place in its group of six
    const int64_t w0 = (b - I) / 6 * 4;     // the group's first word
    if (pf && (I == 0 || I == 3)) {  // the group's words 0-1 or 2-3, PF_BYTES ahead per row
      UNROLL
      for (int r = 0; r < R; ++r) {
        for (int64_t w = w0 + (I == 0 ? 0 : 2); w < w0 + (I == 0 ? 2 : 4); ++w) {
          const int64_t off = r * L.crs + w * L.cbs;
          if ((off & 63) < 32) _mm_prefetch(codes + off + PF_BYTES, _MM_HINT_T0);
        }
      }
    }
    UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_set1_ps(sc[r * L.srs + b * L.sbs]);
      const uint8_t* row = codes + r * L.crs + w0 * L.cbs;
      auto field = [&](int j, int& p) {  // block b's field j: the word; p its shift
        const int f = 4 * I + j;
        p = 5 * (f % 6);
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + f / 6 * L.cbs));
      };
      if constexpr (!MIN) {  // s * (xs . q'), q' = (code - 16) * 2^p
        __m256 t[MC];
        UNROLL
        for (int j = 0; j < 4; ++j) {
          int p;
          const __m256i v = field(j, p);
          const __m256 q = field_value<SHIFT>(v, p, 16);
          UNROLL
          for (int i = 0; i < MC; ++i) {
            const __m256 xv = _mm256_loadu_ps(xs + i * ldx + b * 32 + 8 * j);
            t[i] = j == 0 ? _mm256_mul_ps(xv, q) : _mm256_fmadd_ps(xv, q, t[i]);
          }
        }
        UNROLL
        for (int i = 0; i < MC; ++i) acc[i][r][I & 1] = _mm256_fmadd_ps(s, t[i], acc[i][r][I & 1]);
      } else {  // w' = fmaf(s, code * 2^p, m * 2^p) = w * 2^p exactly; xs * w' = x * w
        const float m = mn[r * L.srs + b * L.sbs];
        UNROLL
        for (int j = 0; j < 4; ++j) {
          int p;
          const __m256i v = field(j, p);
          const __m256 q = field_value<SHIFT>(v, p, 0);
          const __m256 w = _mm256_fmadd_ps(s, q, _mm256_set1_ps(SHIFT ? m : std::ldexp(m, p)));
          UNROLL
          for (int i = 0; i < MC; ++i) {
            const __m256 xv = _mm256_loadu_ps(xs + i * ldx + b * 32 + 8 * j);
            acc[i][r][j & 1] = _mm256_fmadd_ps(xv, w, acc[i][r][j & 1]);
          }
        }
      }
    }
  };
  using std::integral_constant;
  int64_t b = 0;
  for (; b + 6 <= nb; b += 6) {
    block(b, integral_constant<int, 0>{});
    block(b + 1, integral_constant<int, 1>{});
    block(b + 2, integral_constant<int, 2>{});
    block(b + 3, integral_constant<int, 3>{});
    block(b + 4, integral_constant<int, 4>{});
    block(b + 5, integral_constant<int, 5>{});
  }
  if (b < nb) block(b++, integral_constant<int, 0>{});
  if (b < nb) block(b++, integral_constant<int, 1>{});
  if (b < nb) block(b++, integral_constant<int, 2>{});
  if (b < nb) block(b++, integral_constant<int, 3>{});
  if (b < nb) block(b++, integral_constant<int, 4>{});
  UNROLL
  for (int i = 0; i < MC; ++i) {
    UNROLL
    for (int r = 0; r < R; ++r) y[i * ldy + r] = reduce8(_mm256_add_ps(acc[i][r][0], acc[i][r][1]));
  }
}

// All M rows of x against R weight rows, in x_row_tiles' passes (as dot_rows): with xs (x
// scaled) where it is given, else with x and shifts.
template <int R>
void dot_rows_fields(const float* x, const float* xs, int64_t M, int64_t ldx,
                     const uint8_t* codes, const float* sc, const float* mn, const Steps& L,
                     int64_t nb, float* y, int64_t ldy) {
  x_row_tiles<R>(M, [&](auto mc, auto p, int64_t m) {
    constexpr int MC = decltype(mc)::value, P = decltype(p)::value;
    auto tile = [&](auto min, auto shift) {
      constexpr bool MIN = decltype(min)::value, SHIFT = decltype(shift)::value;
      for (int r = 0; r < R; r += P) {
        dot_tile_fields<P, MC, MIN, SHIFT>((SHIFT ? x : xs) + m * ldx, ldx, codes + r * L.crs,
                                           sc + r * L.srs, MIN ? mn + r * L.srs : nullptr, L,
                                           nb, m == 0, y + m * ldy + r, ldy);
      }
    };
    using std::bool_constant;
    if (mn && xs) tile(bool_constant<true>{}, bool_constant<false>{});
    else if (mn) tile(bool_constant<true>{}, bool_constant<true>{});
    else if (xs) tile(bool_constant<false>{}, bool_constant<false>{});
    else tile(bool_constant<false>{}, bool_constant<true>{});
  });
}
#else
// Without AVX2: each row dequantized, then summed with x (as the plain dot_rows: the same sums).
template <int R>
void dot_rows_fields(const float* x, const float*, int64_t M, int64_t ldx, const uint8_t* codes,
                     const float* sc, const float* mn, const Steps& L, int64_t nb, float* y,
                     int64_t ldy) {
  std::vector<float> w(nb * 32);
  for (int r = 0; r < R; ++r) {
    dequant_row_fields<float>(codes + r * L.crs, sc + r * L.srs, mn ? mn + r * L.srs : nullptr,
                              L, nb, w.data());
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < nb * 32; ++k) {
        acc += x[m * ldx + k] * w[k];
      }
      y[m * ldy + r] = acc;
    }
  }
}
#endif

// float16 → float32, 16 (AVX-512) or 8 (F16C) values per instruction.
void widen(const at::Half* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = to_f(src[i]);
}

// One Q4_K head (quant/kheads.py: d, dmin float16, then 12 bytes of 6-bit sc and m) → its 8
// float32 scales d*sc into s[0..7] and mins -(dmin*m) into m[0..7]: both products exact (11 x 6
// bits), as gguf.quants computes them. The 6-bit fields are unpacked 8 bytes at a time (ggml's
// get_scale_min_k4, as llama.cpp's kmask trick): bytes 0-7 of the 12 hold sc0-3 and m0-3 in
// their low 6 bits and the top 2 bits of sc4-7 and m4-7; bytes 8-11 the low 4 bits of sc4-7
// (low nibbles) and m4-7 (high nibbles).
inline void expand_head(const uint8_t* p, float* s, float* m) {
  uint64_t lo;
  uint32_t hi;
  std::memcpy(&lo, p + 4, 8), std::memcpy(&hi, p + 12, 4);
  const uint64_t a = lo & 0x3F3F3F3F3F3F3F3FULL;  // bytes: sc0-3, m0-3
  const uint64_t b = (uint64_t(hi & 0x0F0F0F0F) | uint64_t((hi >> 4) & 0x0F0F0F0F) << 32) |
                     ((lo >> 2) & 0x3030303030303030ULL);  // bytes: sc4-7, m4-7
  at::Half dh, mh;
  std::memcpy(&dh, p, 2), std::memcpy(&mh, p + 2, 2);
  const float d = to_f(dh), nm = -to_f(mh);  // -(dmin*m) = (-dmin)*m exactly
#if defined(__AVX2__)
  // bytes sc0-7, then m0-7
  const __m128i v = _mm_shuffle_epi8(_mm_set_epi64x(static_cast<int64_t>(b), static_cast<int64_t>(a)),
                                     _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13,
                                                   14, 15));
  const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
  const __m256 mm = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
  _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(d), sc));
  _mm256_storeu_ps(m, _mm256_mul_ps(_mm256_set1_ps(nm), mm));
#else
  for (int k = 0; k < 4; ++k) {
    s[k] = d * static_cast<float>((a >> 8 * k) & 0xFF);
    m[k] = nm * static_cast<float>((a >> (32 + 8 * k)) & 0xFF);
    s[k + 4] = d * static_cast<float>((b >> 8 * k) & 0xFF);
    m[k + 4] = nm * static_cast<float>((b >> (32 + 8 * k)) & 0xFF);
  }
#endif
}

// One Q6_K head (quant/kheads.py: 16 int8 sub-scales sc, then d float16) → its 16 float32
// scales d*sc into s[0..15] (exact: 11 x 8 bits, as gguf.quants computes them).
inline void expand_head6(const uint8_t* p, float* s, float unit = 1.0f) {
  at::Half dh;
  std::memcpy(&dh, p + 16, 2);
  // unit: field_unit(6) for 6-bit codes, 1 for int8 codes: exact, d * sc stays normal
  const float d = to_f(dh) * unit;
#if defined(__AVX2__)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256 dv = _mm256_set1_ps(d);
  _mm256_storeu_ps(s, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
  _mm256_storeu_ps(s + 8, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(
                                                _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)))));
#else
  for (int k = 0; k < 16; ++k) s[k] = d * static_cast<float>(static_cast<int8_t>(p[k]));
#endif
}

// One Q3_K head (quant/kheads.py: the file's 12 bytes of 6-bit sub-scales, then d float16) →
// its 16 float32 scales d*(sc - 32) * unit into s[0..15] (ggml's dequantize_row_q3_K, whose
// kmask1 / kmask2 words amount to: sub-scale i's low 4 bits in nibble i / 8 of byte i % 8, its
// high 2 bits at bit 2 (i / 4) of byte 8 + i % 4; exact: 11 x 6 bits, as gguf.quants computes).
inline void expand_head3(const uint8_t* p, float* s, float unit) {
  at::Half dh;
  std::memcpy(&dh, p + 12, 2);
  const float d = to_f(dh) * unit;  // exact: a power of two
#if defined(__AVX2__)
  // loaded straight from the head (a copy through a small array stalls on store forwarding)
  const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));  // bytes 0 .. 7
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(a, low),
                                        _mm_and_si128(_mm_srli_epi16(a, 4), low));  // sc & 15
  // byte i <- byte 8 + i % 4, shifted right by 2 (i / 4) (within its byte: bits 0 .. 7)
  const __m128i t = _mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(load_u32(p + 8))),
                                     _mm_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3));
  const __m128i hi = _mm_and_si128(_mm_srlv_epi32(t, _mm_setr_epi32(0, 2, 4, 6)),
                                   _mm_set1_epi8(3));
  const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
  const __m256 dv = _mm256_set1_ps(d);
  _mm256_storeu_ps(s, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
  _mm256_storeu_ps(s + 8, _mm256_mul_ps(dv, _mm256_cvtepi32_ps(
                                                _mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
#else
  for (int i = 0; i < 16; ++i) {
    const int lo = (p[i % 8] >> (4 * (i / 8))) & 15, hi = (p[8 + i % 4] >> (2 * (i / 4))) & 3;
    s[i] = d * static_cast<float>((lo | hi << 4) - 32);
  }
#endif
}

// One Q2_K head (quant/kheads.py: the file's 16 bytes of 4-bit sub-scales sc (low nibble) and
// sub-mins m (high nibble), then d and dmin float16) → float32 scales d*sc * unit into s[0..15]
// and mins -(dmin*m) into m[0..15] (ggml's dequantize_row_q2_K; exact: 11 x 4 bits, as
// gguf.quants computes them).
inline void expand_head2(const uint8_t* p, float* s, float* m, float unit) {
  at::Half dh, mh;
  std::memcpy(&dh, p + 16, 2), std::memcpy(&mh, p + 18, 2);
  const float d = to_f(dh) * unit, nm = -to_f(mh);  // exact: a power of two; -(dmin*m) exact
#if defined(__AVX2__)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i sc = _mm_and_si128(v, low), mm = _mm_and_si128(_mm_srli_epi16(v, 4), low);
  const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(nm);
  auto lanes = [](__m128i b, int half) {  // bytes 8 half .. 8 half + 7 as 8 float32
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(half ? _mm_srli_si128(b, 8) : b));
  };
  _mm256_storeu_ps(s, _mm256_mul_ps(dv, lanes(sc, 0)));
  _mm256_storeu_ps(s + 8, _mm256_mul_ps(dv, lanes(sc, 1)));
  _mm256_storeu_ps(m, _mm256_mul_ps(mv, lanes(mm, 0)));
  _mm256_storeu_ps(m + 8, _mm256_mul_ps(mv, lanes(mm, 1)));
#else
  for (int i = 0; i < 16; ++i) {
    s[i] = d * static_cast<float>(p[i] & 15);
    m[i] = nm * static_cast<float>(p[i] >> 4);
  }
#endif
}

// One IQ4_XS head (quant/kheads.py: d float16, scales_h uint16, scales_l[4]) → its 8 float32
// scales d*(sc - 32) into s[0..7], sc the 6-bit sub-scale of block i: low 4 bits in nibble i % 2
// of scales_l[i / 2], high 2 bits at bit 2i of scales_h (ggml's dequantize_row_iq4_xs; exact:
// 11 x 6 bits, as gguf.quants computes them).
inline void expand_head_xs(const uint8_t* p, float* s) {
  at::Half dh;
  uint16_t hi;
  uint32_t lo;  // scales_l: sc i's low 4 bits at bit 4i
  std::memcpy(&dh, p, 2), std::memcpy(&hi, p + 2, 2), std::memcpy(&lo, p + 4, 4);
  const float d = to_f(dh);
#if defined(__AVX2__)
  // the 8 sub-scales at once: lane i shifts lo by 4i and hi by 2i
  const __m256i l = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(lo)),
                                      _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32(hi), _mm256_setr_epi32(0, 2, 4, 6, 8, 10,
                                                                             12, 14));
  const __m256i h2 = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(3)), 4);
  const __m256i sc = _mm256_or_si256(_mm256_and_si256(l, _mm256_set1_epi32(15)), h2);
  const __m256 sf = _mm256_cvtepi32_ps(_mm256_sub_epi32(sc, _mm256_set1_epi32(32)));
  _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(d), sf));
#else
  for (int i = 0; i < 8; ++i) {
    const int sc = static_cast<int>((lo >> 4 * i) & 15) | (((hi >> 2 * i) & 3) << 4);
    s[i] = d * static_cast<float>(sc - 32);
  }
#endif
}

// Heads by code layout: Q4_K (BITS 4) 16 bytes for 8 blocks of 32, with mins; Q6_K (BITS 6,
// or 8: int8 codes) 18 bytes for 16 blocks of 16, without; Q3_K (BITS 3) 14 bytes for 16 blocks
// of 16, without; Q2_K (BITS 2) 20 bytes for 16 blocks of 16, with mins; IQ4_XS (TABLE4) 8
// bytes for 8 blocks of 32, without.
// Q5_K (BITS 5) has Q4_K's heads.
constexpr int64_t head_bytes(int bits) {
  return bits == 4 || bits == 5 ? 16 : bits == TABLE4 ? 8 : bits == 3 ? 14 : bits == 2 ? 20 : 18;
}
// Whether a head format has mins (Q4_K, Q5_K, Q2_K).
constexpr bool head_mins(int bits) { return bits == 4 || bits == 5 || bits == 2; }
constexpr int64_t head_blocks(int bits) {
  return bits == 4 || bits == 5 || bits == TABLE4 ? 8 : 16;
}

template <int BITS>
inline void expand_one(const uint8_t* p, float* s, float* m) {
  if constexpr (BITS == 4 || BITS == 5) {
    expand_head(p, s, m);
  } else if constexpr (BITS == TABLE4) {
    expand_head_xs(p, s);
  } else if constexpr (BITS == 3) {
    expand_head3(p, s, field_unit(3));
  } else if constexpr (BITS == 2) {
    expand_head2(p, s, m, field_unit(2));
  } else {
    expand_head6(p, s, BITS == 6 ? field_unit(6) : 1.0f);  // int8 codes (bits 8): 1
  }
}

// The heads of `rows` rows from a tile's first row (h: that row's head 0; heads lie
// (rows / T, nS, T, HB), row-major (rows, nS, HB) where T = 1; HB: head_bytes) → the float32
// scales (and Q4_K's mins; m is not written for Q6_K) of their blocks, row-major (rows, nb)
// whatever T is (ROWS), or arranged as a tile's float scales are ((rows / T, nb, T): the int8
// kernel's tile bodies).
template <int BITS, bool ROWS>
void expand_heads(const uint8_t* h, int64_t rows, int64_t T, int64_t ns, float* s, float* m) {
  constexpr int64_t HB = head_bytes(BITS), PER = head_blocks(BITS);
  const int64_t nb = ns * PER;
  for (int64_t t0 = 0; t0 < rows; t0 += T) {  // each tile (T = 1: each row)
    for (int64_t r = 0; r < T && t0 + r < rows; ++r) {
      for (int64_t j = 0; j < ns; ++j) {
        const uint8_t* p = h + (t0 * ns + j * T + r) * HB;
        if constexpr (ROWS) {
          const int64_t o = (t0 + r) * nb + j * PER;
          expand_one<BITS>(p, s + o, m ? m + o : m);
        } else {
          float ts[PER], tm[PER];
          expand_one<BITS>(p, ts, tm);
          for (int k = 0; k < PER; ++k) {
            s[t0 * nb + (j * PER + k) * T + r] = ts[k];
            if (head_mins(BITS)) m[t0 * nb + (j * PER + k) * T + r] = tm[k];
          }
        }
      }
    }
  }
}

template <int BITS, int BS, typename S>
void qmm_impl(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
              const torch::Tensor& mn, int64_t T, torch::Tensor& y) {
  // nb: scale blocks per row (Q6_K: 4 per 64-value code block)
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1), nb = K / scale_block(BITS, BS);
  const bool fields = is_fields(BITS, T, codes);  // 5-bit codes as bit fields (32-B words)
  const Arrangement A = arrangement<BITS, BS>(T, K, fields);
  const Steps L = A.steps();
  const float* xp = x.data_ptr<float>();
  std::vector<float> xs;  // fields: x scaled by 2^-p per field, where that is exact
  if (fields && scalable_for_fields(xp, M * K)) {
    xs.resize(M * K);
    scale_for_fields(xp, M, K, xs.data());
  }
  const uint8_t* cp = static_cast<const uint8_t*>(codes.data_ptr());
  const S* sp = scale.data_ptr<S>();
  const S* mp = mn.numel() ? mn.data_ptr<S>() : nullptr;
  float* yp = y.data_ptr<float>();
  // threads take whole tiles; a band (64 rows, a whole number of tiles) at a time
  at::parallel_for(0, N / T, T == 1 ? 16 : 2, [&](int64_t t0, int64_t t1) {
    const int64_t n0 = t0 * T, n1 = t1 * T;
    // float16 scales are widened into float32 a band of rows at a time (small buffers that stay
    // in cache): converting them per block inside the loop (load, vcvtph2ps, register
    // broadcast) cost ~35% of the time. A band of whole tiles keeps the tiles' arrangement.
    constexpr int64_t band = 64;
    // K-quant heads (S = uint8_t): Q4_K 16 bytes per 8 blocks, Q6_K 18 per 16, expanded a band
    // at a time as float16 scales are widened
    constexpr bool heads = std::is_same_v<S, uint8_t>;
    const int64_t srow = heads ? nb / head_blocks(BITS) * head_bytes(BITS)
                               : nb * int64_t(sizeof(S));  // scale bytes per row
    std::vector<float> sbuf, mbuf;
    if constexpr (!std::is_same_v<S, float>) {
      sbuf.resize(band * nb);
      if (mp || (heads && head_mins(BITS))) mbuf.resize(band * nb);
    }
    for (int64_t b0 = n0; b0 < n1; b0 += band) {
      const int64_t b1 = b0 + band < n1 ? b0 + band : n1;
      if (b1 < n1) {  // the next band's scales and mins (codes: in dot_rows)
        const int64_t next = (b1 + band < n1 ? band : n1 - b1) * srow;
        prefetch_range(reinterpret_cast<const uint8_t*>(sp) + b1 * srow, next);
        if (mp) prefetch_range(mp + b1 * nb, next);
      }
      const float* sf;
      const float* mf;
      if constexpr (std::is_same_v<S, float>) {
        sf = sp + b0 * nb, mf = mp ? mp + b0 * nb : nullptr;
      } else if constexpr (heads) {
        float* mb = head_mins(BITS) ? mbuf.data() : nullptr;  // Q6_K, ...: no mins
        expand_heads<BITS, true>(sp + b0 * srow, b1 - b0, T, nb / head_blocks(BITS), sbuf.data(),
                                 mb);
        sf = sbuf.data(), mf = mb;  // row-major (band, nb): see rows below
      } else {
        widen(sp + b0 * nb, (b1 - b0) * nb, sbuf.data());
        if (mp) widen(mp + b0 * nb, (b1 - b0) * nb, mbuf.data());
        sf = sbuf.data(), mf = mp ? mbuf.data() : nullptr;
      }
      // Q4_K: scales and mins expanded row-major (band, nb), so their steps are a row's nb and
      // a block's 1, whatever the codes' arrangement is
      const Steps LS = heads ? Steps{L.crs, L.cbs, nb, 1} : L;
      auto rows = [&](auto r, int64_t n) {  // rows n .. n + R - 1, within one tile
        constexpr int R = decltype(r)::value;
        const int64_t s = heads ? (n - b0) * nb : A.scale_at(n) - b0 * nb;
        if constexpr (BITS == 5) {
          if (fields) {
            dot_rows_fields<R>(xp, xs.empty() ? nullptr : xs.data(), M, K, cp + A.code_at(n),
                               sf + s, mf ? mf + s : nullptr, L, nb, yp + n, N);
            return;
          }
        }
        dot_rows<BITS, BS, R>(xp, M, K, cp + A.code_at(n), sf + s, mf ? mf + s : nullptr, LS, K,
                              yp + n, N);
      };
      int64_t n = b0;
      if (T == 8) {
        for (; n < b1; n += 8) rows(std::integral_constant<int, 8>{}, n);
      } else if (T == 4) {
        for (; n < b1; n += 4) rows(std::integral_constant<int, 4>{}, n);
      } else {
        for (; n + 4 <= b1 && T == 1; n += 4) rows(std::integral_constant<int, 4>{}, n);
        for (; n < b1; ++n) rows(std::integral_constant<int, 1>{}, n);
      }
    }
  });
}

template <int BITS, int BS, typename S>
void dequant_impl(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& mn,
                  int64_t T, int64_t r0, torch::Tensor& out) {
  const int64_t K = out.size(1), nb = K / scale_block(BITS, BS);  // scale blocks per row
  const bool fields = is_fields(BITS, T, codes);
  const Arrangement A = arrangement<BITS, BS>(T, K, fields);
  const Steps L = A.steps();
  const uint8_t* cp = static_cast<const uint8_t*>(codes.data_ptr());
  const S* sp = scale.data_ptr<S>();
  const S* mp = mn.numel() ? mn.data_ptr<S>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, out.size(0), 16, [&](int64_t a, int64_t b) {
    std::vector<float> hs, hm;  // Q4_K: the row's expanded heads, (nb,) each
    for (int64_t i = a; i < b; ++i) {
      const int64_t n = r0 + i, s = A.scale_at(n);
      if constexpr (std::is_same_v<S, uint8_t>) {
        constexpr int64_t HB = head_bytes(BITS), PER = head_blocks(BITS);
        const int64_t ns = nb / PER, r = n % T;
        hs.resize(nb), hm.resize(nb);
        for (int64_t j = 0; j < ns; ++j) {  // heads (N/T, nS, T, HB): row n's head j
          expand_one<BITS>(sp + ((n - r) * ns + j * T + r) * HB, hs.data() + j * PER,
                           hm.data() + j * PER);
        }
        dequant_row_fast<BITS, BS, float>(cp + A.code_at(n), hs.data(),
                                          head_mins(BITS) ? hm.data() : nullptr,
                                          Steps{L.crs, L.cbs, nb, 1}, K, op + i * K);
      } else if (fields) {
        dequant_row_fields<S>(cp + A.code_at(n), sp + s, mp ? mp + s : nullptr, L, nb,
                              op + i * K);
      } else {
        dequant_row_fast<BITS, BS, S>(cp + A.code_at(n), sp + s, mp ? mp + s : nullptr, L, K,
                                      op + i * K);
      }
    }
  });
}

#define DISPATCH(bits, bs, scale, FN, ...)                                         \
  if (scale.scalar_type() == torch::kByte) {  /* K-quant and IQ4_XS heads */     \
    if (bits == 6) FN<6, 64, uint8_t>(__VA_ARGS__);                               \
    else if (bits == 3) FN<3, 64, uint8_t>(__VA_ARGS__);                          \
    else if (bits == 2) FN<2, 64, uint8_t>(__VA_ARGS__);                          \
    else if (bits == 5) FN<5, 32, uint8_t>(__VA_ARGS__);                          \
    else if (bits == 8) FN<8, 16, uint8_t>(__VA_ARGS__);                          \
    else if (bits == TABLE4) FN<TABLE4, 32, uint8_t>(__VA_ARGS__);                \
    else FN<4, 32, uint8_t>(__VA_ARGS__);                                         \
  } else if (scale.scalar_type() == torch::kFloat) {                              \
    if (bits == 8 && bs == 16) FN<8, 16, float>(__VA_ARGS__);                     \
    else if (bits == 8) FN<8, 32, float>(__VA_ARGS__);                            \
    else if (bits == 5) FN<5, 32, float>(__VA_ARGS__);                            \
    else FN<4, 32, float>(__VA_ARGS__);                                           \
  } else {                                                                        \
    if (bits == 8 && bs == 16) FN<8, 16, at::Half>(__VA_ARGS__);                  \
    else if (bits == 8) FN<8, 32, at::Half>(__VA_ARGS__);                         \
    else if (bits == 5) FN<5, 32, at::Half>(__VA_ARGS__);                         \
    else if (bits == TABLE4) FN<TABLE4, 32, at::Half>(__VA_ARGS__);               \
    else FN<4, 32, at::Half>(__VA_ARGS__);                                        \
  }

}  // namespace

// Entry points for qgemv_ops.cpp (which checks the arguments first) and qgemv_i8.cpp.
void qgemv_expand_heads(int64_t bits, const uint8_t* h, int64_t rows, int64_t T, int64_t ns,
                        float* s, float* m) {
  if (bits == 4 || bits == 5) {  // Q4_K's and Q5_K's heads
    expand_heads<4, false>(h, rows, T, ns, s, m);
  } else {
    expand_heads<8, false>(h, rows, T, ns, s, m);
  }
}
int64_t qgemv_row_bytes(int64_t bits, int64_t K) { return row_bytes_of(static_cast<int>(bits), K); }
// 32-byte words per row of nb blocks of 5-bit codes held as bit fields (in row tiles), and
// whether a weight's codes are such fields.
int64_t qgemv_fields_words(int64_t nb) { return fields_words(nb); }
bool qgemv_is_fields(int64_t bits, int64_t T, const torch::Tensor& codes) {
  return is_fields(bits, T, codes);
}

// Whether row tiles should hold 5-bit codes as bit fields on this build: where the products of
// ggml's layout run the AVX2 (or plain C++) body, whose summation order the fields' body keeps
// (bit-identical results); the AVX-512 body sums 16 lanes in another order, and its table
// lookups already read ggml's fifth bits cheaply, so AVX-512 builds keep ggml's blocks.
bool qgemv_fields_preferred() {
#if defined(__AVX512F__)
  return false;
#else
  return true;
#endif
}

// Rows per row tile for a weight of `bits`-bit codes in blocks of `bs` on this build. AVX-512: 8
// (its body holds 8 rows' 16-lane accumulators). AVX2 computes 4 weight rows per pass of x, so a
// tile of 4 is one sequential stream per pass where a tile of 8 is read in two interleaved
// halves; measured on an AMD Zen 3 (2 threads, 12-30 distinct matrices swept so they stream from
// memory, tiles of 4 / tiles of 8): Q6_K 896 x 4864 0.85, 640 x 2048 0.79; Q5_0 fields
// 9728 x 896 0.92, 4096 x 640 0.98; Q4_K 0.97-1.02; Q4_1 0.95-1.02. Q8_0 keeps 8, read in one
// pass of 8 rows (x_row_tiles' WIDE): its large heads measured 0.98 (Qwen2.5) and 1.06 (Gemma 3)
// with tiles of 4. The products are the same either way (a row's sum does not depend on T).
int64_t qgemv_preferred_tile(int64_t bits, int64_t bs) {
#if defined(__AVX512F__)
  return 8;
#else
  return bits == 8 && bs == 32 ? 8 : 4;
#endif
}

// y (M, N) = x (M, K) float32 contiguous @ dequant(W).T; W in row tiles of T rows (1: row-major).
void qmm_run(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
             const torch::Tensor& mn, int64_t bits, int64_t bs, int64_t T, torch::Tensor& y) {
  DISPATCH(bits, bs, scale, qmm_impl, x, codes, scale, mn, T, y);
}

// out (R, K) = rows [r0, r0 + R) of dequant(W).
void dequant_run(const torch::Tensor& codes, const torch::Tensor& scale, const torch::Tensor& mn,
                 int64_t bits, int64_t bs, int64_t T, int64_t r0, torch::Tensor& out) {
  DISPATCH(bits, bs, scale, dequant_impl, codes, scale, mn, T, r0, out);
}
