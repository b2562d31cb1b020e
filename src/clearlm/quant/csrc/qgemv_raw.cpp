// Products and dequantization for GGUF blocks kept as the file stores them (quant/raw.py):
// Q5_K (256 values a block; IQ4_NL, IQ4_XS, Q3_K and Q2_K, kept here once, are qgemv.cpp's
// table or field codes now: quant/iq4.py, quant/kheads.py). A weight is
//   codes (N, nb * REST) uint8: each block's bytes but its float16 d / dmin, in the block's order;
//   scale = d, min = dmin (or empty) (N, nb) float16;
// or the same blocks in row tiles of T rows (codes (N/T, nb, T * REST), scales (N/T, nb, T),
// quant/tiles.py). `bits` = 100 + the GGML type id names the format.
//
// Each block's weights are rebuilt (into a small float buffer, or at M = 1 straight into the
// sums: no store and reload per weight) with the float32 operations
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

enum : int { Q5K = 113 };

// values per block and bytes of a block's codes (its bytes but d / dmin)
constexpr int qk_of(int) { return 256; }
constexpr int rest_of(int f) {
  return f == Q5K ? 172 : 0;
}


inline float half_to_f(at::Half v) {
#if defined(__F16C__)
  return _cvtsh_ss(v.x);
#else
  return static_cast<float>(v);
#endif
}

// 16 int32 lanes of codes and the few operations the formats need on them, for AVX-512 (one
// register), AVX2 (two) or plain C++; each ends in 16 float32 weights (FV), computed with
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
struct FV {  // 16 float32 lanes
  __m512 v;
};
inline FV w_fma(I16 q, float dl, float nml) {  // dl * q + nml, one rounding
  return {_mm512_fmadd_ps(_mm512_set1_ps(dl), _mm512_cvtepi32_ps(q.v), _mm512_set1_ps(nml))};
}
inline FV fv_zero() { return {_mm512_setzero_ps()}; }
inline FV fv_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void fv_store(float* p, FV a) { _mm512_storeu_ps(p, a.v); }
inline FV fv_add(FV a, FV b) { return {_mm512_add_ps(a.v, b.v)}; }
inline FV fv_fma(FV a, FV b, FV c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
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
struct FV {  // lanes 0-7, 8-15
  __m256 lo, hi;
};
inline FV w_fma(I16 q, float dl, float nml) {
  const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(nml);
  return {_mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q.lo), m),
          _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q.hi), m)};
}
inline FV fv_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline FV fv_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void fv_store(float* p, FV a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline FV fv_add(FV a, FV b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline FV fv_fma(FV a, FV b, FV c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
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
struct FV {
  float v[16];
};
inline FV w_fma(I16 q, float dl, float nml) {
  FV r;
  for (int l = 0; l < 16; ++l) r.v[l] = std::fmaf(dl, static_cast<float>(q.v[l]), nml);
  return r;
}
inline FV fv_zero() { return FV{}; }
inline FV fv_load(const float* p) {
  FV r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void fv_store(float* p, FV a) { std::memcpy(p, a.v, sizeof a.v); }
inline FV fv_add(FV a, FV b) {
  for (int l = 0; l < 16; ++l) a.v[l] += b.v[l];
  return a;
}
inline FV fv_fma(FV a, FV b, FV c) {
  for (int l = 0; l < 16; ++l) c.v[l] = std::fmaf(a.v[l], b.v[l], c.v[l]);
  return c;
}
#endif

// The weights of one block, 16 at a time in increasing order, to out.put(o, weights o .. o + 15):
// c its codes, d and dmin its scales as float32.
template <int F, class Sink>
inline void dequant_block(const uint8_t* c, float d, float dmin, Sink& out) {
  if constexpr (F == Q5K) {  // scales[12] qh[32] qs[128]: 8 sub-blocks of 32
    const uint8_t *sc = c, *qh = c + 12, *qs = c + 44;
#pragma GCC unroll 8
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
        out.put(32 * j + h, w_fma(bor(lo, hi), dl, -ml));
      }
    }
  }
}

// Where dequant_block's weights go. Store: to w. Dot: into the block's x . w, in 16 lanes: lane l
// sums x[16 j + l] * w[16 j + l] over even j (t0) and odd j (t1) separately, two chains of fused
// multiply-adds from zero (the first term is then x * w rounded once, as a product).
struct Store {
  float* w;
  void put(int o, FV v) { fv_store(w + o, v); }
};
struct Dot {
  const float* x;
  FV t0 = fv_zero(), t1 = fv_zero();
  void put(int o, FV v) {
    if (o & 16) {
      t1 = fv_fma(fv_load(x + o), v, t1);
    } else {
      t0 = fv_fma(fv_load(x + o), v, t0);
    }
  }
  FV sum() const { return fv_add(t0, t1); }
};

// acc[0..15] += the block's x . w (Dot's lanes) for weights already in w.
template <int QK>
inline void dot_block(const float* x, const float* w, float* acc) {
  Dot t{x};
  for (int o = 0; o < QK; o += 16) t.put(o, fv_load(w + o));
  fv_store(acc, fv_add(fv_load(acc), t.sum()));
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
  if (M == 1) {  // decode: each block's weights go straight into the row's sums, not to memory
    at::parallel_for(0, (N + G - 1) / G, 4, [&](int64_t g0, int64_t g1) {
      alignas(64) float lanes[16];
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t n0 = g * G, rows = n0 + G <= N ? G : N - n0;
        for (int64_t r = 0; r < rows; ++r) {  // a row at a time: its tile is in cache after one
          const int64_t n = n0 + r;
          FV acc = fv_zero();
          for (int64_t b = 0; b < L.nb; ++b) {
            const int64_t s = L.scale_at(n) + b * L.sbs();
            Dot t{xp + b * QK};
            dequant_block<F>(cp + L.code_at(n) + b * L.cbs(), half_to_f(sp[s]),
                             mp ? half_to_f(mp[s]) : 0.0f, t);
            acc = fv_add(acc, t.sum());  // the order the buffered path below adds in
          }
          fv_store(lanes, acc);
          yp[n] = reduce16(lanes);
        }
      }
    });
    return;
  }
  at::parallel_for(0, (N + G - 1) / G, 4, [&](int64_t g0, int64_t g1) {
    alignas(64) float w[QK];
    Store st{w};
    std::vector<float> acc(G * M * 16);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * G, rows = n0 + G <= N ? G : N - n0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t b = 0; b < L.nb; ++b) {  // block b of every row of the group: one stream
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t n = n0 + r, s = L.scale_at(n) + b * L.sbs();
          dequant_block<F>(cp + L.code_at(n) + b * L.cbs(), half_to_f(sp[s]),
                           mp ? half_to_f(mp[s]) : 0.0f, st);
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
        Store st{op + i * K + b * QK};
        dequant_block<F>(cp + L.code_at(n) + b * L.cbs(), half_to_f(sp[s]),
                         mp ? half_to_f(mp[s]) : 0.0f, st);
      }
    }
  });
}

#define RAW_DISPATCH(bits, FN, ...)                               \
  switch (bits) {                                                 \
    case Q5K: FN<Q5K>(__VA_ARGS__); break;                        \
    default: TORCH_CHECK(false, "unknown raw block format ", bits); \
  }

}  // namespace

// Whether `bits` names a raw block format, and its values per block and code bytes per block
// (0 where it does not).
bool qgemv_is_raw(int64_t bits) {
  return bits == Q5K;
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
