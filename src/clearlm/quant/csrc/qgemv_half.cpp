// y = x @ W.T for a weight kept 16-bit as the GGUF stores it: W (N, K) float16 or bfloat16,
// x (M, K) float32, y (M, N) float32 (quant/half.py). Each weight is widened to float32 in
// registers (exact for both formats: a float16 or bfloat16 value is a float32 value) and
// multiplied with float32 fused multiply-adds, 16 lanes per row (AVX-512; AVX2 + F16C + FMA;
// plain C++ on other CPUs), the lanes summed at the end:
// the same order for a row whatever M and the rows computed with it. Memory-bound decode reads
// 2 bytes per weight instead of float32's 4.
//
// Blocking: 4 weight rows × 4 rows of x at a time (16 accumulators); the 4 weight rows
// (4 · K · 2 bytes, 7 KiB at K = 896) stay in L1 while every tile of x rows passes over them,
// so the weight is read from memory once per call. While a group of 4 rows is multiplied, the
// next group's rows are prefetched (a cache line per row every 32 weights): from memory this
// took a 4864 × 896 product from 1.35 to 0.87 ms (1 thread, best of 15; float32 F.linear 1.54).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t RW = 4, RX = 4;  // weight rows, x rows per tile

#if defined(__AVX512F__)
// 16 weights from k on (the first `n` of them, n <= 16), widened to float32.
template <bool BF16>
inline __m512 load_w(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  if constexpr (BF16) {  // bfloat16 is the top half of a float32: shift into place
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(h);
  }
}

// rw weight rows (<= RW) × rx x rows (<= RX): y[m][n] for the tile, written to yp.
template <bool BF16>
void tile(const float* xp, const uint16_t* wp, const uint16_t* next, int64_t K, int64_t N,
          int64_t rx, int64_t rw, float* yp) {
  __m512 acc[RX][RW];
  for (int64_t i = 0; i < RX; ++i)
    for (int64_t j = 0; j < RW; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = K - k >= 16 ? 0xFFFF : (__mmask16)((1u << (K - k)) - 1);
    __m512 w[RW];
    for (int64_t j = 0; j < RW; ++j)
      w[j] = j < rw ? load_w<BF16>(wp + j * K + k, mask) : _mm512_setzero_ps();
    if (next != nullptr && (k & 31) == 0)  // the next group's rows: a 64-byte line each
      for (int64_t j = 0; j < RW; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(next + j * K + k), _MM_HINT_T0);
    for (int64_t i = 0; i < RX; ++i) {
      if (i >= rx) break;
      const __m512 xv = _mm512_maskz_loadu_ps(mask, xp + i * K + k);
      for (int64_t j = 0; j < RW; ++j) acc[i][j] = _mm512_fmadd_ps(xv, w[j], acc[i][j]);
    }
  }
  for (int64_t i = 0; i < rx; ++i)
    for (int64_t j = 0; j < rw; ++j) yp[i * N + j] = _mm512_reduce_add_ps(acc[i][j]);
}
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
// AVX2: the same 16 lanes as two 8-float registers; a tail of K % 16 weights is copied into
// zero-padded buffers first (a zero weight and a zero x add nothing).
template <bool BF16>
inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (BF16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(h);
  }
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

template <bool BF16>
void tile(const float* xp, const uint16_t* wp, const uint16_t* next, int64_t K, int64_t N,
          int64_t rx, int64_t rw, float* yp) {
  for (int64_t i = 0; i < rx; ++i) {  // one x row at a time: 8 accumulators, 8 weights
    __m256 lo[RW], hi[RW];
    for (int64_t j = 0; j < RW; ++j) lo[j] = hi[j] = _mm256_setzero_ps();
    alignas(32) uint16_t wt[RW][16];
    alignas(32) float xt[16];
    for (int64_t k = 0; k < K; k += 16) {
      const uint16_t* w[RW];
      const float* xk = xp + i * K + k;
      if (K - k >= 16) {
        for (int64_t j = 0; j < RW; ++j) w[j] = wp + (j < rw ? j : 0) * K + k;
      } else {  // the tail, zero-padded
        const int64_t n = K - k;
        std::fill(xt, xt + 16, 0.0f);
        std::copy(xk, xk + n, xt);
        xk = xt;
        for (int64_t j = 0; j < RW; ++j) {
          std::fill(wt[j], wt[j] + 16, uint16_t{0});
          std::copy(wp + (j < rw ? j : 0) * K + k, wp + (j < rw ? j : 0) * K + K, wt[j]);
          w[j] = wt[j];
        }
      }
      if (next != nullptr && i == 0 && (k & 31) == 0)
        for (int64_t j = 0; j < RW; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(next + j * K + k), _MM_HINT_T0);
      const __m256 x0 = _mm256_loadu_ps(xk), x1 = _mm256_loadu_ps(xk + 8);
      for (int64_t j = 0; j < RW; ++j) {
        lo[j] = _mm256_fmadd_ps(x0, load8<BF16>(w[j]), lo[j]);
        hi[j] = _mm256_fmadd_ps(x1, load8<BF16>(w[j] + 8), hi[j]);
      }
    }
    for (int64_t j = 0; j < rw; ++j) yp[i * N + j] = sum8(lo[j]) + sum8(hi[j]);
  }
}
#else
// Plain C++: 16 partial sums per (x row, weight row), lane k % 16, as the vector paths; 16
// weights are widened into a buffer first, and each lane adds x * w with a multiply and an add
// (std::fma is a slow library call on a CPU without FMA): the error bound is the same.
template <bool BF16>
void tile(const float* xp, const uint16_t* wp, const uint16_t*, int64_t K, int64_t N,
          int64_t rx, int64_t rw, float* yp) {
  for (int64_t i = 0; i < rx; ++i) {
    for (int64_t j = 0; j < rw; ++j) {
      float lanes[16] = {}, w[16];
      for (int64_t k = 0; k < K; k += 16) {
        const int64_t n = std::min<int64_t>(16, K - k);
        for (int64_t l = 0; l < n; ++l) {
          const uint16_t h = wp[j * K + k + l];
          w[l] = BF16 ? static_cast<float>(c10::BFloat16(h, c10::BFloat16::from_bits()))
                      : static_cast<float>(c10::Half(h, c10::Half::from_bits()));
        }
        for (int64_t l = 0; l < n; ++l) lanes[l] += xp[i * K + k + l] * w[l];
      }
      float s = 0.0f;
      for (float v : lanes) s += v;
      yp[i * N + j] = s;
    }
  }
}
#endif

template <bool BF16>
void hmm_impl(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const float* xp = x.data_ptr<float>();
  const auto* wp = static_cast<const uint16_t*>(w.data_ptr());
  float* yp = y.data_ptr<float>();
  // a task is 16 weight rows at least: fewer makes threads' start-up cost more than their work
  at::parallel_for(0, (N + RW - 1) / RW, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n0 = g * RW, rw = std::min(RW, N - n0);
      // the rows to prefetch: the next group's, when it is a whole one (nothing past the end)
      const uint16_t* next = n0 + 2 * RW <= N ? wp + (n0 + RW) * K : nullptr;
      for (int64_t m0 = 0; m0 < M; m0 += RX) {
        tile<BF16>(xp + m0 * K, wp + n0 * K, next, K, N, std::min(RX, M - m0), rw,
                   yp + m0 * N + n0);
      }
    }
  });
}

}  // namespace

// x (M, K) float32, w (N, K) float16 or bfloat16 contiguous -> (M, N) float32.
torch::Tensor hmm(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.is_cpu() && w.is_cpu(), "x and w must be on the CPU");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "w must be a contiguous (N, K) matrix");
  TORCH_CHECK(w.scalar_type() == torch::kHalf || w.scalar_type() == torch::kBFloat16,
              "w must be float16 or bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat, "x must be (M, K) float32");
  x = x.contiguous();
  TORCH_CHECK(x.size(1) == w.size(1), "shape mismatch");
  auto y = torch::empty({x.size(0), w.size(0)}, x.options());
  if (w.scalar_type() == torch::kBFloat16) {
    hmm_impl<true>(x, w, y);
  } else {
    hmm_impl<false>(x, w, y);
  }
  return y;
}
