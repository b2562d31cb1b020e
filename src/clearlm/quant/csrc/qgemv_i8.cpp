// The int8-activation variant of qgemv.cpp's product (opt-in: it rounds the activations).
//
// As llama.cpp does with its Q8 activations: each row of x is quantized per block of 32 values to
// int8, xq = round(x / dx) with dx = max|x| / 127 (so |x - dx·xq| ≤ dx / 2), and the weight codes
// are multiplied with xq in integers by AVX-512 VNNI (vpdpbusd: 64 unsigned-byte × signed-byte
// products summed in groups of 4 into 16 int32 lanes). Per 64 values that is one integer dot,
// one int→float conversion and one FMA with the lanes' scale·dx, instead of rebuilding 64
// float32 weights: about 2-3x fewer instructions than the exact kernel.
//   y[m, n] = Σ_lanes float(I_lane) · s_block · dx_block  +  Σ_b min_b · dx_b · Σ_{k∈b} xq_k
// Signed int8 codes (Q8_0, Q6_K) enter vpdpbusd as (code XOR 0x80) = code + 128; the extra
// 128·Σxq per lane is exact and is removed by starting each lane's sum at -128·Σxq (precomputed
// once per x row); centred 4/5-bit codes (Q4_0, Q5_0: no min) start at -8·Σxq or -16·Σxq. The
// integer sums are exact; only the rounding of x and the float32 summation
// differ from F.linear(x, W_deq): |Δy| ≤ Σ_b dx_b/2 · Σ_{k∈b} |W[n, k]| (tests/quant/test_quant_i8.py).
//
// Two bodies: AVX-512 VNNI (vpdpbusd, 64 values per step) and AVX2 (most CPUs without
// AVX-512: vpmaddubsw + vpmaddwd, 32 values per step, int8 codes as |code| with their sign
// moved onto xq, as llama.cpp's AVX2 path does; see the AVX2 dot_rows_i8). The integer lane
// sums are the same; the float sums are taken in another order, so the two bodies' results
// differ within float32 rounding.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

// qgemv.cpp: the Q4_K (bits 4) or Q6_K (8) heads of `rows` rows → float32 scales (and Q4_K's
// mins), arranged as a tile's float scales are ((rows / T, nb, T); T = 1: row-major).
void qgemv_expand_heads(int64_t bits, const uint8_t* h, int64_t rows, int64_t T, int64_t ns,
                        float* s, float* m);

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define CLEARLM_I8_AVX512 1
#endif
#if defined(CLEARLM_I8_AVX512) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
namespace {

// One quantized row of x: xq (K int8), per 4-value lane group: dx (float) and -128·Σxq
// (int32); per block of 32: dx·Σxq (float, for the mins).
struct QRow {
  std::vector<int8_t> q;
  std::vector<float> dx4;
  std::vector<int32_t> neg4;
  std::vector<float> fsum;
  bool exact = false;  // a block's max |x| is out of the safe range: the row is computed exactly
};

// The block maxima max|x| the int8 path takes: 0, or [2^-64, 2^64]. Outside it (or NaN, inf)
// 127 / max|x| or dx·Σxq or scale·dx could overflow or lose their precision to subnormals
// (|x| < 3.7e-37 made 127 / max|x| inf, every xq -128), so such a row is computed by the exact
// kernel instead (qmm_i8 in qgemv_ops.cpp): no activation of a real model is near either end.
inline bool safe_block_max(float amax) {
  return amax == 0.0f || (amax >= 0x1p-64f && amax <= 0x1p64f);
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// A block's step dx = max|x| / 127 and its inverse `inv` (0 for an all-zero block); flags the
// row for the exact kernel when max|x| is out of safe_block_max's range.
inline float block_step(float amax, QRow& r, float& inv) {
  if (!safe_block_max(amax)) r.exact = true;
  inv = amax > 0 ? 127.0f / amax : 0.0f;
  return amax / 127.0f;
}

// Block b's entries of `r` from the exact int32 sums of its 8 four-value groups of xq: dx per
// group, -128 * sum per group, and dx * (the block's sum) for the mins.
inline void store_block(QRow& r, int64_t b, float dx, __m256i sums) {
  alignas(32) int32_t g[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(g), sums);
  int32_t total = 0;
  for (int j = 0; j < 8; ++j) {
    r.dx4[b * 8 + j] = dx, r.neg4[b * 8 + j] = -128 * g[j], total += g[j];
  }
  r.fsum[b] = dx * static_cast<float>(total);
}

// Software prefetch, as in qgemv.cpp: codes PF_BYTES ahead of the read, one prefetch per
// 64-byte line of each row; the next band's scales / mins at the start of a band (run).
constexpr int64_t PF_BYTES = 8192;

inline void prefetch_range(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

// Bytes of one block's codes.
constexpr int64_t block_bytes(int bits, int64_t bs) { return bits == 8 ? bs : bits == 4 ? 16 : 20; }

#ifdef CLEARLM_I8_AVX512
// x rounded per block of 32 (K a multiple of 64). Vectorized: |x| maximum by a reduction,
// round-to-nearest-even by vcvtps2dq (std::nearbyint's rounding in the default mode), the four-
// value sums by vpdpbusd with a vector of ones (exact integer sums).
void quantize_row(const float* x, int64_t K, QRow& r) {
  r.q.resize(K), r.dx4.resize(K / 4), r.neg4.resize(K / 4), r.fsum.resize(K / 32);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
    // vmaxps drops a NaN operand, so a NaN in x is looked for apart: its block's dx becomes NaN
    // and so does every y, as F.linear gives (NaN · w is NaN for every weight, 0 included)
    const bool nan = (_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) |
                      _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q)) != 0;
    const float amax = nan ? NAN : _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
    float inv;
    const float dx = block_step(amax, r, inv);
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, vinv)));
    const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, vinv)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + b * 32), q0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + b * 32 + 16), q1);
    // sums of 4 consecutive codes: 1 (unsigned) · q (signed), 4 products per int32 lane
    const __m256i q = _mm256_set_m128i(q1, q0);
    const __m256i sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
    store_block(r, b, dx, sums);
  }
}

// The codes of 64 consecutive values of a row as 64 unsigned bytes in natural order: the 64 / BS
// blocks that start at `blk`, one block every `cbs` bytes (row-major: adjacent; row tiles of T
// rows: T blocks apart, qgemv.cpp).
template <int BITS, int BS>
inline __m512i codes64(const uint8_t* blk, int64_t cbs) {
  auto ld128 = [](const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  };
  if (BITS == 8) {  // int8 code + 128 as an unsigned byte
    __m512i v;
    if (cbs == BS) {
      v = _mm512_loadu_si512(blk);
    } else if (BS == 32) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + cbs));
      v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    } else {
      v = _mm512_castsi128_si512(ld128(blk));
      v = _mm512_inserti32x4(v, ld128(blk + cbs), 1);
      v = _mm512_inserti32x4(v, ld128(blk + 2 * cbs), 2);
      v = _mm512_inserti32x4(v, ld128(blk + 3 * cbs), 3);
    }
    return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  const __m256i v =  // two blocks' 16 nibble bytes
      (BITS == 4 && cbs == 16) ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk))
                               : _mm256_set_m128i(ld128(blk + cbs), ld128(blk));
  const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  // 128-bit lanes [lo_b, lo_b1, hi_b, hi_b1] → [lo_b, hi_b, lo_b1, hi_b1] (codes in order)
  __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));
  if (BITS == 5) {  // fifth bits: qh bit j is code j's, in order
    const uint64_t qh =
        load_u32(blk + 16) | (static_cast<uint64_t>(load_u32(blk + cbs + 16)) << 32);
    z = _mm512_mask_add_epi8(z, qh, z, _mm512_set1_epi8(16));
  }
  return z;
}

// The lanes' weight scales for the 64 values of blocks b .. b + 64 / BS - 1 of a row (lane l
// covers values 4l .. 4l + 3); block b's scale at sc[b * sbs].
template <int BS>
inline __m512 lane_scales(const float* sc, int64_t b, int64_t sbs) {
  if (BS == 32) {
    return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(sc[b * sbs]),
                                _mm512_set1_ps(sc[(b + 1) * sbs]));
  }
  const __m128 four = sbs == 1 ? _mm_loadu_ps(sc + b)
                               : _mm_set_ps(sc[(b + 3) * sbs], sc[(b + 2) * sbs],
                                            sc[(b + 1) * sbs], sc[b * sbs]);
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(four));
}

// R weight rows against one quantized x row; row r's block b at codes + r * crs + b * cbs, its
// scale and min at r * srs + b * sbs (qgemv.cpp's Steps).
template <int BITS, int BS, int R>
void dot_rows_i8(const QRow& x, const uint8_t* codes, int64_t crs, int64_t cbs, const float* sc,
                 const float* mn, int64_t srs, int64_t sbs, int64_t K, float* y) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  constexpr int64_t bpb = block_bytes(BITS, BS), per64 = 64 / BS;  // blocks per 64 values
  for (int64_t e = 0; e < K; e += 64) {
    const int64_t b = e / BS;
    for (int r = 0; r < R; ++r) {  // one prefetch per 64-byte line of each row's stream
      for (int64_t j = 0; j < per64; ++j) {
        const int64_t off = r * crs + (b + j) * cbs;
        if ((off & 63) < bpb) _mm_prefetch(codes + off + PF_BYTES, _MM_HINT_T0);
      }
    }
    const __m512i xq = _mm512_loadu_si512(x.q.data() + e);
    const __m512 dx = _mm512_loadu_ps(x.dx4.data() + e / 4);
    // each lane's sum starts at -128·Σxq (int8 codes, entered as code + 128), at -8·Σxq or
    // -16·Σxq (centred 4/5-bit codes: W = s·(code - 8 or 16)), else at 0 (codes with mins)
    const __m512i neg = _mm512_loadu_si512(x.neg4.data() + e / 4);
    const __m512i init = BITS == 8 ? neg
                         : mn      ? _mm512_setzero_si512()
                                   : _mm512_srai_epi32(neg, BITS == 4 ? 4 : 3);
    for (int r = 0; r < R; ++r) {
      const __m512i i =
          _mm512_dpbusd_epi32(init, codes64<BITS, BS>(codes + r * crs + b * cbs, cbs), xq);
      const __m512 s = _mm512_mul_ps(lane_scales<BS>(sc + r * srs, b, sbs), dx);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float ms = 0.0f;  // Σ_b min_b · dx_b · Σxq_b (blocks of 32), in block order
    if (mn) {
      const float* m = mn + r * srs;
      for (int64_t b = 0; b < K / 32; ++b) ms = std::fmaf(m[b * sbs], x.fsum[b], ms);
    }
    y[r] = _mm512_reduce_add_ps(acc[r]) + ms;
  }
}

// A whole row tile (T = R = 8 rows, qgemv.cpp's arrangement): the 8 rows' scales (and mins) of
// block b lie side by side, so each 64-value step multiplies the scales of all 8 rows by dx in
// one or two vectors and each row takes its lanes' scales with one permute (the generic path
// builds them per row: two broadcasts, a blend, a multiply), and the mins' term is one 8-lane
// FMA per block for all 8 rows. The same operations per row as dot_rows_i8, so the same sums.
template <int BITS, int BS>
void dot_tile8_i8(const QRow& x, const uint8_t* codes, int64_t cbs, const float* sc,
                  const float* mn, int64_t K, float* y) {
  constexpr int64_t bpb = block_bytes(BITS, BS), per64 = 64 / BS;
  __m512 acc[8];
  __m512i idx[8];  // lane l of row r: entry (block of lane l within the step) * 8 + r
  for (int r = 0; r < 8; ++r) {
    acc[r] = _mm512_setzero_ps();
    alignas(64) int32_t at[16];
    for (int l = 0; l < 16; ++l) at[l] = (4 * l / BS) * 8 + r;
    idx[r] = _mm512_load_si512(at);
  }
  __m256 macc = _mm256_setzero_ps();  // the mins' term of the 8 rows
  for (int64_t e = 0; e < K; e += 64) {
    const int64_t b = e / BS;
    for (int64_t off = b * cbs; off < (b + per64) * cbs; off += 64) {  // one stream
      _mm_prefetch(codes + off + PF_BYTES, _MM_HINT_T0);
    }
    const __m512i xq = _mm512_loadu_si512(x.q.data() + e);
    const __m512i neg = _mm512_loadu_si512(x.neg4.data() + e / 4);
    const __m512i init = BITS == 8 ? neg
                         : mn      ? _mm512_setzero_si512()
                                   : _mm512_srai_epi32(neg, BITS == 4 ? 4 : 3);
    const __m512 dx0 = _mm512_set1_ps(x.dx4[e / 4]), dx1 = _mm512_set1_ps(x.dx4[e / 4 + 8]);
    __m512 s0, s1;  // scale · dx of entries 0 .. 15 and 16 .. 31 (block-major, 8 rows each)
    if (BS == 32) {
      s0 = _mm512_mul_ps(_mm512_loadu_ps(sc + b * 8), _mm512_mask_blend_ps(0xFF00, dx0, dx1));
      s1 = s0;
    } else {  // blocks of 16: b, b + 1 in the first 32 values, b + 2, b + 3 in the second
      s0 = _mm512_mul_ps(_mm512_loadu_ps(sc + b * 8), dx0);
      s1 = _mm512_mul_ps(_mm512_loadu_ps(sc + b * 8 + 16), dx1);
    }
    for (int r = 0; r < 8; ++r) {
      const __m512i i = _mm512_dpbusd_epi32(init, codes64<BITS, BS>(codes + r * bpb + b * cbs, cbs),
                                            xq);
      const __m512 s = BS == 32 ? _mm512_permutexvar_ps(idx[r], s0)
                                : _mm512_permutex2var_ps(s0, idx[r], s1);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc[r]);
    }
    if (mn) {  // blocks of 32 (mins need them)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t bj = e / 32 + j;
        macc = _mm256_fmadd_ps(_mm256_loadu_ps(mn + bj * 8), _mm256_set1_ps(x.fsum[bj]), macc);
      }
    }
  }
  alignas(32) float ms[8];
  _mm256_store_ps(ms, macc);
  for (int r = 0; r < 8; ++r) y[r] = _mm512_reduce_add_ps(acc[r]) + ms[r];
}

void widen(const at::Half* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

#else  // AVX2 + FMA + F16C: 8 int32 lanes, 32 values per step
// One row of x rounded as above, with 8-lane vectors: |x| maximum by vmaxps (a NaN looked for
// apart, as vmaxps drops it), vcvtps2dq (round to nearest even), int32 → int8 by two saturating
// packs (which interleave 4-value groups within 128-bit halves: a dword permute puts them back
// in order), the four-value sums by vpmaddubsw with ones then vpmaddwd with ones (exact).
void quantize_row(const float* x, int64_t K, QRow& r) {
  r.q.resize(K), r.dx4.resize(K / 4), r.neg4.resize(K / 4), r.fsum.resize(K / 32);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    __m256 v[4];
    __m256 amax8 = _mm256_setzero_ps(), unord = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + b * 32 + 8 * j);
      unord = _mm256_or_ps(unord, _mm256_cmp_ps(v[j], v[j], _CMP_UNORD_Q));
      amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm256_movemask_ps(unord) ? NAN : _mm_cvtss_f32(m4);
    float inv;
    const float dx = block_step(amax, r, inv);
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], vinv));
    // packs: dwords [q0 0-3, q1 0-3, q2 0-3, q3 0-3 | q0 4-7, q1 4-7, q2 4-7, q3 4-7] as bytes
    __m256i q8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    q8 = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(r.q.data() + b * 32), q8);
    const __m256i sums =  // 1 (unsigned) · q (signed) in pairs, then pairs of pairs
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q8), _mm256_set1_epi16(1));
    store_block(r, b, dx, sums);
  }
}

// The codes of 32 consecutive values of a row as 32 bytes in natural order: one block of 32 at
// `blk`, or two of 16, the second `cbs` bytes on. 8-bit codes as they are (signed), 4/5-bit
// codes as unsigned bytes 0 .. 31.
template <int BITS, int BS>
inline __m256i codes32(const uint8_t* blk, int64_t cbs) {
  auto ld128 = [](const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  };
  if constexpr (BITS == 8) {
    if constexpr (BS == 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    return _mm256_set_m128i(ld128(blk + cbs), ld128(blk));
  } else {
    const __m128i v = ld128(blk);  // byte i: code i (low nibble) and code i + 16 (high nibble)
    __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v),
                                 _mm256_set1_epi8(0x0F));
    if constexpr (BITS == 5) {  // byte i takes qh's byte i / 8, keeps bit i % 8: +16 where set
      const __m256i qh = _mm256_set1_epi32(static_cast<int>(load_u32(blk + 16)));
      const __m256i pick = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                              0x0303030303030303);
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
      const __m256i h = _mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bit);
      c = _mm256_or_si256(c, _mm256_and_si256(_mm256_cmpeq_epi8(h, bit), _mm256_set1_epi8(16)));
    }
    return c;
  }
}

// R weight rows against one quantized x row, 32 values per step (one block of 32, or two of
// 16: lanes 0-3 take the first block's scale, 4-7 the second's); same layout arguments as the
// AVX-512 dot_rows_i8. vpmaddubsw multiplies unsigned by signed bytes and sums pairs into int16
// with saturation, so every pair must stay within ±32,767: 4/5-bit codes (≤ 31) times |xq| ≤
// 127 do; int8 codes enter as |code| with their sign moved onto xq (vpsignb), 2 · 128 · 127 =
// 32,512. vpmaddwd with ones then sums pairs of pairs: the same exact integer lane sums as
// vpdpbusd's, over 4 values each.
template <int BITS, int BS, int R>
void dot_rows_i8(const QRow& x, const uint8_t* codes, int64_t crs, int64_t cbs, const float* sc,
                 const float* mn, int64_t srs, int64_t sbs, int64_t K, float* y) {
  __m256 acc[R];
  float ms[R];  // Σ_b min_b · dx_b · Σxq_b (blocks of 32), in block order, row by row
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps(), ms[r] = 0.0f;
  constexpr int64_t bpb = block_bytes(BITS, BS), per32 = 32 / BS;  // blocks per 32 values
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t e = 0; e < K; e += 32) {
    const int64_t b = e / BS;
    for (int r = 0; r < R; ++r) {  // one prefetch per 64-byte line of each row's stream
      for (int64_t j = 0; j < per32; ++j) {
        const int64_t off = r * crs + (b + j) * cbs;
        if ((off & 63) < bpb) _mm_prefetch(codes + off + PF_BYTES, _MM_HINT_T0);
      }
    }
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + e));
    const __m256 dx = _mm256_set1_ps(x.dx4[e / 4]);  // one block of x per step
    // centred 4/5-bit codes: each lane's sum starts at -8·Σxq or -16·Σxq; else at 0
    const __m256i init =
        (BITS == 8 || mn)
            ? _mm256_setzero_si256()
            : _mm256_srai_epi32(
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.neg4.data() + e / 4)),
                  BITS == 4 ? 4 : 3);
    for (int r = 0; r < R; ++r) {
      const __m256i c = codes32<BITS, BS>(codes + r * crs + b * cbs, cbs);
      const __m256i pairs = BITS == 8
          ? _mm256_maddubs_epi16(_mm256_abs_epi8(c), _mm256_sign_epi8(xq, c))
          : _mm256_maddubs_epi16(c, xq);
      const __m256i i = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), init);
      const float* s = sc + r * srs + b * sbs;
      const __m256 ls = BS == 32 ? _mm256_set1_ps(s[0])
                                 : _mm256_set_m128(_mm_set1_ps(s[sbs]), _mm_set1_ps(s[0]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(ls, dx), acc[r]);
      // the mins' term here, not in a loop of its own after: its dependent FMAs then overlap
      // with the integer work (a separate loop took Q4_1 at 4,864 x 896 from 0.26 to 0.38 ms)
      if (mn) ms[r] = std::fmaf(mn[r * srs + b * sbs], x.fsum[b], ms[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    y[r] = _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v))) + ms[r];
  }
}

void widen(const at::Half* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
#endif

// Rows of T-row tiles (T = 1: row-major), as qgemv.cpp's Arrangement. S = uint8_t: Q4_K's,
// Q5_K's or Q6_K's super-block heads (quant/kheads.py), expanded a band at a time by qgemv.cpp.
template <int BITS, int BS, typename S>
void run(const std::vector<QRow>& xs, const uint8_t* cp, const S* sp, const S* mp, int64_t N,
         int64_t K, int64_t T, float* yp) {
  const int64_t nb = K / BS, bpb = block_bytes(BITS, BS);
  const int64_t row_bytes = nb * bpb;
  const int64_t crs = T == 1 ? row_bytes : bpb, cbs = T * bpb, srs = T == 1 ? nb : 1, sbs = T;
  at::parallel_for(0, N / T, T == 1 ? 16 : 2, [&](int64_t t0, int64_t t1) {
    const int64_t n0 = t0 * T, n1 = t1 * T;
    constexpr int64_t band = 64;  // float16 scales widened a band of rows (whole tiles) at a time
    constexpr bool heads = std::is_same_v<S, uint8_t>;
    constexpr bool k4 = BITS == 4 || BITS == 5;  // Q4_K's and Q5_K's heads, else Q6_K's
    const int64_t per = k4 ? 8 : 16, hb = k4 ? 16 : 18;  // blocks, bytes a head
    const int64_t srow = heads ? nb / per * hb : nb * int64_t(sizeof(S));  // scale bytes a row
    std::vector<float> sbuf, mbuf;
    for (int64_t b0 = n0; b0 < n1; b0 += band) {
      const int64_t b1 = std::min(b0 + band, n1);
      if (b1 < n1) {  // the next band's scales and mins (codes: in dot_rows_i8)
        const int64_t next = (std::min(b1 + band, n1) - b1) * srow;
        prefetch_range(reinterpret_cast<const uint8_t*>(sp) + b1 * srow, next);
        if (mp) prefetch_range(mp + b1 * nb, next);
      }
      const float* sf;
      const float* mf = nullptr;
      if constexpr (std::is_same_v<S, float>) {
        sf = sp + b0 * nb, mf = mp ? mp + b0 * nb : nullptr;
      } else if constexpr (heads) {
        sbuf.resize((b1 - b0) * nb), mbuf.resize((b1 - b0) * nb);
        qgemv_expand_heads(BITS, sp + b0 * srow, b1 - b0, T, nb / per, sbuf.data(), mbuf.data());
        sf = sbuf.data(), mf = k4 ? mbuf.data() : nullptr;  // Q6_K: no mins
      } else {
        sbuf.resize((b1 - b0) * nb), widen(sp + b0 * nb, (b1 - b0) * nb, sbuf.data());
        sf = sbuf.data();
        if (mp) mbuf.resize((b1 - b0) * nb), widen(mp + b0 * nb, (b1 - b0) * nb, mbuf.data());
        if (mp) mf = mbuf.data();
      }
      for (size_t m = 0; m < xs.size(); ++m) {
        auto rows = [&](auto r, int64_t n) {  // rows n .. n + R - 1, within one tile
          constexpr int R = decltype(r)::value;
          const int64_t c = (n - n % T) * row_bytes + n % T * bpb;
          const int64_t s = (n - n % T) * nb + n % T - b0 * nb;
          dot_rows_i8<BITS, BS, R>(xs[m], cp + c, crs, cbs, sf + s, mf ? mf + s : nullptr, srs,
                                   sbs, K, yp + m * N + n);
        };
        int64_t n = b0;
        if (T == 8) {
#ifdef CLEARLM_I8_AVX512
          for (; n < b1; n += 8) {
            const int64_t s = (n - b0) * nb;  // the tile's scales: (nb, 8)
            dot_tile8_i8<BITS, BS>(xs[m], cp + n * row_bytes, cbs, sf + s, mf ? mf + s : nullptr,
                                   K, yp + m * N + n);
          }
#else
          for (; n < b1; n += 4) rows(std::integral_constant<int, 4>{}, n);  // 2 per tile
#endif
        } else if (T == 4) {
          for (; n < b1; n += 4) rows(std::integral_constant<int, 4>{}, n);
        } else {
          for (; n + 4 <= b1 && T == 1; n += 4) rows(std::integral_constant<int, 4>{}, n);
          for (; n < b1; ++n) rows(std::integral_constant<int, 1>{}, n);
        }
      }
    }
  });
}

}  // namespace

bool qmm_i8_available() { return true; }

// x (M, K) float32 contiguous, K a multiple of 64; codes/scale/min checked by the caller. The
// rows of x that need the exact product (safe_block_max) are added to `exact_rows`; their rows
// of the result are left for the caller to overwrite.
torch::Tensor qmm_i8_impl(const torch::Tensor& x, const torch::Tensor& codes,
                          const torch::Tensor& scale, const torch::Tensor& mn, int64_t bits,
                          int64_t bs, int64_t N, int64_t T, std::vector<int64_t>& exact_rows) {
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 64 == 0, "int8 activations need K a multiple of 64");
  TORCH_CHECK(bs == 32 || !mn.numel(), "mins need blocks of 32");
  std::vector<QRow> xs(M);
  for (int64_t m = 0; m < M; ++m) {
    quantize_row(x.data_ptr<float>() + m * K, K, xs[m]);
    if (xs[m].exact) exact_rows.push_back(m);
  }
  auto y = torch::empty({M, N}, x.options());
  const uint8_t* cp = static_cast<const uint8_t*>(codes.data_ptr());
  float* yp = y.data_ptr<float>();
  const bool f32 = scale.scalar_type() == torch::kFloat;
  const bool heads = scale.scalar_type() == torch::kByte;  // Q4_K, Q5_K, Q6_K (kheads.py)
#define RUN(B, S_, T_)                                                                 \
  run<B, S_, T_>(xs, cp, scale.data_ptr<T_>(), mn.numel() ? mn.data_ptr<T_>() : nullptr, N, K, T, \
                 yp)
  if (bits == 8 && bs == 16) {
    if (heads) RUN(8, 16, uint8_t); else if (f32) RUN(8, 16, float); else RUN(8, 16, at::Half);
  } else if (bits == 8) {
    if (f32) RUN(8, 32, float); else RUN(8, 32, at::Half);
  } else if (bits == 5) {
    if (heads) RUN(5, 32, uint8_t); else if (f32) RUN(5, 32, float); else RUN(5, 32, at::Half);
  } else if (heads) {
    RUN(4, 32, uint8_t);
  } else {
    if (f32) RUN(4, 32, float); else RUN(4, 32, at::Half);
  }
#undef RUN
  return y;
}
#else
bool qmm_i8_available() { return false; }

torch::Tensor qmm_i8_impl(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                          const torch::Tensor&, int64_t, int64_t, int64_t, int64_t,
                          std::vector<int64_t>&) {
  TORCH_CHECK(false, "int8 activations need AVX-512 VNNI or AVX2");
}
#endif
