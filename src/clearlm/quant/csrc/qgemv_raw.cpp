// Products and dequantization for GGUF blocks kept as the file stores them (quant/raw.py):
// Q2_K, Q3_K, Q5_K, IQ4_XS (256 values a block) and IQ4_NL (32). A weight is
//   codes (N, nb * REST) uint8: each block's bytes but its float16 d / dmin, in the block's order;
//   scale = d, min = dmin (or empty) (N, nb) float16;
// or the same blocks in row tiles of T rows (codes (N/T, nb, T * REST), scales (N/T, nb, T),
// quant/tiles.py). `bits` = 100 + the GGML type id names the format.
//
// Each block's weights are rebuilt into a small float buffer with the float32 operations
// gguf.quants.dequantize does (ggml-common.h's layouts; gguf-py's quants.py): d * sub-scale and
// dmin * sub-min are exact products, the product with the code is exact too, so the weight is
// either exact or (with a min) rounded once by one fused multiply-add, as the reference rounds
// d*q - m once: the same float32 values bit for bit. The product then sums x * w in 16 float32
// lanes (two partial sums per block, added into the row's running lanes), the same order for a
// row whatever M, the rows computed with it and the layout are.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

enum : int { Q2K = 110, Q3K = 111, Q5K = 113, IQ4NL = 120, IQ4XS = 123 };

// values per block and bytes of a block's codes (its bytes but d / dmin)
constexpr int qk_of(int f) { return f == IQ4NL ? 32 : 256; }
constexpr int rest_of(int f) {
  return f == Q2K ? 80 : f == Q3K ? 108 : f == Q5K ? 172 : f == IQ4NL ? 16 : 134;
}

// IQ4_NL / IQ4_XS's non-linear 4-bit codebook (ggml-common.h kvalues_iq4nl)
constexpr float kIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                            1,    13,   25,  38,  53,  69,  89,  113};

inline float half_to_f(at::Half v) {
#if defined(__F16C__)
  return _cvtsh_ss(v.x);
#else
  return static_cast<float>(v);
#endif
}

// 16 int32 lanes of codes and the few operations the formats need on them, for AVX-512 (one
// register), AVX2 (two) or plain C++; each ends in 16 float32 weights stored to w, computed with
// the same single float32 operation per weight on every build (exact products; one fused
// multiply-add where a min is subtracted, as the reference rounds d*q - m once).
#if defined(__AVX512F__)
struct I16 {
  __m512i v;
};
inline I16 load_u8(const uint8_t* p) {  // 16 bytes, zero-extended
  return {_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline I16 srl(I16 a, int s) { return {_mm512_srl_epi32(a.v, _mm_cvtsi32_si128(s))}; }
inline I16 sll(I16 a, int s) { return {_mm512_sll_epi32(a.v, _mm_cvtsi32_si128(s))}; }
inline I16 band(I16 a, int m) { return {_mm512_and_si512(a.v, _mm512_set1_epi32(m))}; }
inline I16 bor(I16 a, I16 b) { return {_mm512_or_si512(a.v, b.v)}; }
inline I16 subc(I16 a, int c) { return {_mm512_sub_epi32(a.v, _mm512_set1_epi32(c))}; }
inline void store_fma(float* w, I16 q, float dl, float nml) {  // dl * q + nml, one rounding
  _mm512_storeu_ps(w, _mm512_fmadd_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(q.v),
                                      _mm512_set1_ps(nml)));
}
inline void store_mul(float* w, I16 q, float dl) {  // dl * q (exact)
  _mm512_storeu_ps(w, _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(q.v)));
}
inline void store_lut(float* w, I16 q, float dl) {  // dl * kIQ4[q] (exact), q in 0 .. 15
  _mm512_storeu_ps(w, _mm512_mul_ps(_mm512_set1_ps(dl),
                                    _mm512_permutexvar_ps(q.v, _mm512_loadu_ps(kIQ4))));
}
#elif defined(__AVX2__) && defined(__FMA__)
struct I16 {
  __m256i lo, hi;  // lanes 0-7, 8-15
};
inline I16 load_u8(const uint8_t* p) {
  return {_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline I16 srl(I16 a, int s) {
  const __m128i c = _mm_cvtsi32_si128(s);
  return {_mm256_srl_epi32(a.lo, c), _mm256_srl_epi32(a.hi, c)};
}
inline I16 sll(I16 a, int s) {
  const __m128i c = _mm_cvtsi32_si128(s);
  return {_mm256_sll_epi32(a.lo, c), _mm256_sll_epi32(a.hi, c)};
}
inline I16 band(I16 a, int m) {
  const __m256i v = _mm256_set1_epi32(m);
  return {_mm256_and_si256(a.lo, v), _mm256_and_si256(a.hi, v)};
}
inline I16 bor(I16 a, I16 b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
inline I16 subc(I16 a, int c) {
  const __m256i v = _mm256_set1_epi32(c);
  return {_mm256_sub_epi32(a.lo, v), _mm256_sub_epi32(a.hi, v)};
}
inline void store_fma(float* w, I16 q, float dl, float nml) {
  const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(nml);
  _mm256_storeu_ps(w, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q.lo), m));
  _mm256_storeu_ps(w + 8, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q.hi), m));
}
inline void store_mul(float* w, I16 q, float dl) {
  const __m256 d = _mm256_set1_ps(dl);
  _mm256_storeu_ps(w, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q.lo)));
  _mm256_storeu_ps(w + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q.hi)));
}
inline __m256 lut8(__m256i q) {  // kIQ4[q]: two 8-entry lookups, the upper one where q > 7
  const __m256 a = _mm256_permutevar8x32_ps(_mm256_loadu_ps(kIQ4), q);
  const __m256 b = _mm256_permutevar8x32_ps(_mm256_loadu_ps(kIQ4 + 8), q);
  return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_cmpgt_epi32(q, _mm256_set1_epi32(7))));
}
inline void store_lut(float* w, I16 q, float dl) {
  const __m256 d = _mm256_set1_ps(dl);
  _mm256_storeu_ps(w, _mm256_mul_ps(d, lut8(q.lo)));
  _mm256_storeu_ps(w + 8, _mm256_mul_ps(d, lut8(q.hi)));
}
#else
struct I16 {
  int32_t v[16];
};
inline I16 load_u8(const uint8_t* p) {
  I16 r;
  for (int l = 0; l < 16; ++l) r.v[l] = p[l];
  return r;
}
inline I16 srl(I16 a, int s) {
  for (int32_t& x : a.v) x = static_cast<int32_t>(static_cast<uint32_t>(x) >> s);
  return a;
}
inline I16 sll(I16 a, int s) {
  for (int32_t& x : a.v) x = static_cast<int32_t>(static_cast<uint32_t>(x) << s);
  return a;
}
inline I16 band(I16 a, int m) {
  for (int32_t& x : a.v) x &= m;
  return a;
}
inline I16 bor(I16 a, I16 b) {
  for (int l = 0; l < 16; ++l) a.v[l] |= b.v[l];
  return a;
}
inline I16 subc(I16 a, int c) {
  for (int32_t& x : a.v) x -= c;
  return a;
}
inline void store_fma(float* w, I16 q, float dl, float nml) {
  for (int l = 0; l < 16; ++l) w[l] = std::fmaf(dl, static_cast<float>(q.v[l]), nml);
}
inline void store_mul(float* w, I16 q, float dl) {
  for (int l = 0; l < 16; ++l) w[l] = dl * static_cast<float>(q.v[l]);
}
inline void store_lut(float* w, I16 q, float dl) {
  for (int l = 0; l < 16; ++l) w[l] = dl * kIQ4[q.v[l]];
}
#endif

// The weights of one block into w[qk_of(F)]: c its codes, d and dmin its scales as float32.
template <int F>
inline void dequant_block(const uint8_t* c, float d, float dmin, float* w) {
  if constexpr (F == Q5K) {  // scales[12] qh[32] qs[128]: 8 sub-blocks of 32
    const uint8_t *sc = c, *qh = c + 12, *qs = c + 44;
    for (int j = 0; j < 8; ++j) {
      // 6-bit scale and min of sub-block j (gguf's Q4_K.get_scale_min)
      const int s = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 2) & 0x30);
      const int m = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 2) & 0x30);
      const float dl = d * static_cast<float>(s), ml = dmin * static_cast<float>(m);
      // code l: nibble (j odd: high) of qs byte 32 (j / 2) + l, fifth bit: bit j of qh byte l
      const uint8_t* q = qs + 32 * (j / 2);
      for (int h = 0; h < 32; h += 16) {
        const I16 lo = band(srl(load_u8(q + h), 4 * (j & 1)), 0x0F);
        const I16 hi = sll(band(srl(load_u8(qh + h), j), 1), 4);
        store_fma(w + 32 * j + h, bor(lo, hi), dl, -ml);
      }
    }
  } else if constexpr (F == Q2K) {  // scales[16] qs[64]: 16 sub-blocks of 16
    const uint8_t *sc = c, *qs = c + 16;
    for (int i = 0; i < 16; ++i) {
      const float dl = d * static_cast<float>(sc[i] & 0x0F);
      const float ml = dmin * static_cast<float>(sc[i] >> 4);
      // value v = 16 i + l: byte 32 (v / 128) + v % 32, bits 2 ((v % 128) / 32)
      const I16 q = load_u8(qs + 32 * (i / 8) + 16 * (i % 2));
      store_fma(w + 16 * i, band(srl(q, 2 * ((i % 8) / 2)), 3), dl, -ml);
    }
  } else if constexpr (F == Q3K) {  // hmask[32] qs[64] scales[12]: 16 sub-blocks of 16
    const uint8_t *hm = c, *qs = c + 32, *sc = c + 96;
    for (int i = 0; i < 16; ++i) {
      const int lo = i < 8 ? sc[i] & 0x0F : sc[i - 8] >> 4;
      const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
      const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
      // 2 low bits as Q2_K's; the offset 4 applies where hmask byte v % 32's bit v / 32 is 0:
      // q = ql - 4 + 4 h = (ql | h << 2) - 4
      const I16 ql = band(srl(load_u8(qs + 32 * (i / 8) + 16 * (i % 2)), 2 * ((i % 8) / 2)), 3);
      const I16 h = band(srl(load_u8(hm + 16 * (i % 2)), i / 2), 1);
      store_mul(w + 16 * i, subc(bor(ql, sll(h, 2)), 4), dl);
    }
  } else if constexpr (F == IQ4NL) {  // qs[16]: code l in byte l's low nibble, l + 16 high
    store_lut(w, band(load_u8(c), 0x0F), d);
    store_lut(w + 16, srl(load_u8(c), 4), d);
  } else {  // IQ4_XS: scales_h (uint16) scales_l[4] qs[128]: 8 sub-blocks of 32
    const int sh = c[0] | (c[1] << 8);
    for (int j = 0; j < 8; ++j) {
      const int ls = ((c[2 + j / 2] >> (4 * (j % 2))) & 0x0F) | (((sh >> (2 * j)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* q = c + 6 + 16 * j;
      store_lut(w + 32 * j, band(load_u8(q), 0x0F), dl);
      store_lut(w + 32 * j + 16, srl(load_u8(q), 4), dl);
    }
  }
}

// acc[0..15] += the block's x . w in 16 lanes: lane l sums x[16 j + l] * w[16 j + l] over even
// j and odd j separately (two chains), then both into acc.
template <int QK>
inline void dot_block(const float* x, const float* w, float* acc) {
#if defined(__AVX512F__)
  __m512 t0 = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(w));
  __m512 t1 = _mm512_mul_ps(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(w + 16));
  for (int j = 2; j < QK / 16; j += 2) {
    t0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * j), _mm512_loadu_ps(w + 16 * j), t0);
    t1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * j + 16), _mm512_loadu_ps(w + 16 * j + 16), t1);
  }
  _mm512_storeu_ps(acc, _mm512_add_ps(_mm512_loadu_ps(acc), _mm512_add_ps(t0, t1)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (int h = 0; h < 16; h += 8) {  // lanes 0-7, then 8-15: the same sums as 16 lanes
    __m256 t0 = _mm256_mul_ps(_mm256_loadu_ps(x + h), _mm256_loadu_ps(w + h));
    __m256 t1 = _mm256_mul_ps(_mm256_loadu_ps(x + 16 + h), _mm256_loadu_ps(w + 16 + h));
    for (int j = 2; j < QK / 16; j += 2) {
      t0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16 * j + h), _mm256_loadu_ps(w + 16 * j + h), t0);
      t1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16 * j + 16 + h),
                           _mm256_loadu_ps(w + 16 * j + 16 + h), t1);
    }
    _mm256_storeu_ps(acc + h, _mm256_add_ps(_mm256_loadu_ps(acc + h), _mm256_add_ps(t0, t1)));
  }
#else
  for (int l = 0; l < 16; ++l) {
    float t0 = x[l] * w[l], t1 = x[16 + l] * w[16 + l];
    for (int j = 2; j < QK / 16; j += 2) {
      t0 = std::fmaf(x[16 * j + l], w[16 * j + l], t0);
      t1 = std::fmaf(x[16 * j + 16 + l], w[16 * j + 16 + l], t1);
    }
    acc[l] += t0 + t1;
  }
#endif
}

// The 16 lanes' sum, pairwise in a fixed order.
inline float reduce16(const float* a) {
  float s[8];
  for (int i = 0; i < 8; ++i) s[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; ++i) s[i] += s[i + 4];
  return (s[0] + s[2]) + (s[1] + s[3]);
}

// Where row n's block b lies: codes at code_at(n) + b * cbs, d / dmin at scale_at(n) + b * sbs.
struct Layout {
  int64_t T, rest, nb;
  int64_t code_at(int64_t n) const { return (n - n % T) * nb * rest + n % T * rest; }
  int64_t scale_at(int64_t n) const { return (n - n % T) * nb + n % T; }
  int64_t cbs() const { return T * rest; }
  int64_t sbs() const { return T; }
};

template <int F>
void qmm_raw_impl(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                  const torch::Tensor& mn, int64_t T, torch::Tensor& y) {
  constexpr int QK = qk_of(F);
  const int64_t M = x.size(0), K = x.size(1), N = y.size(1);
  const Layout L{T, rest_of(F), K / QK};
  const float* xp = x.data_ptr<float>();
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const at::Half* sp = scale.data_ptr<at::Half>();
  const at::Half* mp = mn.numel() ? mn.data_ptr<at::Half>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t G = T == 1 ? 4 : T;  // rows computed together: a tile, or 4 row-major rows
  at::parallel_for(0, (N + G - 1) / G, 4, [&](int64_t g0, int64_t g1) {
    alignas(64) float w[QK];
    std::vector<float> acc(G * M * 16);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * G, rows = n0 + G <= N ? G : N - n0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t b = 0; b < L.nb; ++b) {  // block b of every row of the group: one stream
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = n0 + r, s = L.scale_at(n) + b * L.sbs();
          dequant_block<F>(cp + L.code_at(n) + b * L.cbs(), half_to_f(sp[s]),
                           mp ? half_to_f(mp[s]) : 0.0f, w);
          for (int64_t m = 0; m < M; ++m) {
            dot_block<QK>(xp + m * K + b * QK, w, acc.data() + (r * M + m) * 16);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t m = 0; m < M; ++m) yp[m * N + n0 + r] = reduce16(acc.data() + (r * M + m) * 16);
      }
    }
  });
}

template <int F>
void dequant_raw_impl(const torch::Tensor& codes, const torch::Tensor& scale,
                      const torch::Tensor& mn, int64_t T, int64_t r0, torch::Tensor& out) {
  constexpr int QK = qk_of(F);
  const int64_t K = out.size(1);
  const Layout L{T, rest_of(F), K / QK};
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const at::Half* sp = scale.data_ptr<at::Half>();
  const at::Half* mp = mn.numel() ? mn.data_ptr<at::Half>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, out.size(0), 16, [&](int64_t a, int64_t e) {
    for (int64_t i = a; i < e; ++i) {
      const int64_t n = r0 + i;
      for (int64_t b = 0; b < L.nb; ++b) {
        const int64_t s = L.scale_at(n) + b * L.sbs();
        dequant_block<F>(cp + L.code_at(n) + b * L.cbs(), half_to_f(sp[s]),
                         mp ? half_to_f(mp[s]) : 0.0f, op + i * K + b * QK);
      }
    }
  });
}

#define RAW_DISPATCH(bits, FN, ...)                               \
  switch (bits) {                                                 \
    case Q2K: FN<Q2K>(__VA_ARGS__); break;                        \
    case Q3K: FN<Q3K>(__VA_ARGS__); break;                        \
    case Q5K: FN<Q5K>(__VA_ARGS__); break;                        \
    case IQ4NL: FN<IQ4NL>(__VA_ARGS__); break;                    \
    case IQ4XS: FN<IQ4XS>(__VA_ARGS__); break;                    \
    default: TORCH_CHECK(false, "unknown raw block format ", bits); \
  }

}  // namespace

// Whether `bits` names a raw block format, and its values per block and code bytes per block
// (0 where it does not).
bool qgemv_is_raw(int64_t bits) {
  return bits == Q2K || bits == Q3K || bits == Q5K || bits == IQ4NL || bits == IQ4XS;
}
int64_t qgemv_raw_block(int64_t bits) { return qgemv_is_raw(bits) ? qk_of(bits) : 0; }
int64_t qgemv_raw_rest(int64_t bits) {
  return qgemv_is_raw(bits) ? rest_of(static_cast<int>(bits)) : 0;
}

// y (M, N) = x (M, K) float32 contiguous @ dequant(W).T.
void qmm_raw_run(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& scale,
                 const torch::Tensor& mn, int64_t bits, int64_t T, torch::Tensor& y) {
  RAW_DISPATCH(bits, qmm_raw_impl, x, codes, scale, mn, T, y);
}

// out (R, K) = rows [r0, r0 + R) of dequant(W).
void dequant_raw_run(const torch::Tensor& codes, const torch::Tensor& scale,
                     const torch::Tensor& mn, int64_t bits, int64_t T, int64_t r0,
                     torch::Tensor& out) {
  RAW_DISPATCH(bits, dequant_raw_impl, codes, scale, mn, T, r0, out);
}
