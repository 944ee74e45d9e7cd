// The LayerNorm bodies in AVX-512; built with -mavx512f -ffp-contract=off and run only where
// cpu_body_supported(kAvx512). The row sums keep layernorm.cc's eight lanes (one vector of eight
// doubles in the forward, of eight floats in the backward) and fold them in its order; the
// elementwise loops do its operations lane by lane, each rounded once (no fused multiply-add), so
// the results are the portable body's bits. A row's last cols % 8 (backward's update: % 16)
// elements are done one by one.
// Note: GCC 12 reports the placeholder vectors inside its AVX-512 intrinsics as maybe
// uninitialized (https://gcc.gnu.org/bugzilla/show_bug.cgi?id=105593), as adamw_avx512.cc says.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cmath>

#include "kernels/layernorm_body.h"

namespace zest::cpu {
namespace {

constexpr std::int64_t kLanes = kLayerNormLanes;
static_assert(kLanes == 8, "one vector of doubles, half a vector of floats");
constexpr std::int64_t kWide = 16;

template <typename T>
T fold(T* lanes) {
  for (std::int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (std::int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

inline __m512d widen(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }

// Sums of kRows rows at once, in double lanes (centered: of (row - m)^2): each row's additions
// in the portable body's order, the rows' chains interleaved so that they overlap.
template <bool kCentered, int kRows>
void rows_reduce(const float* x, std::int64_t cols, const double* m, double* sums) {
  __m512d mv[kRows], sum[kRows];
  for (int r = 0; r < kRows; ++r) {
    mv[r] = _mm512_set1_pd(m[r]);
    sum[r] = _mm512_setzero_pd();
  }
  std::int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    for (int r = 0; r < kRows; ++r) {
      __m512d a = widen(x + r * cols + j);
      if constexpr (kCentered) {
        a = _mm512_sub_pd(a, mv[r]);
        a = _mm512_mul_pd(a, a);
      }
      sum[r] = _mm512_add_pd(sum[r], a);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const float* row = x + r * cols;
    alignas(64) double lanes[kLanes];
    _mm512_store_pd(lanes, sum[r]);
    for (std::int64_t k = j; k < cols; ++k) {
      if constexpr (kCentered) {
        const double centered = row[k] - m[r];
        lanes[k % kLanes] += centered * centered;
      } else {
        lanes[k % kLanes] += row[k];
      }
    }
    sums[r] = fold(lanes);
  }
}

template <int kRows>
void forward_rows(const float* x, const float* weight, const float* bias, std::int64_t cols,
                  float eps, float* y, float* mean, float* rstd) {
  double m[kRows], s[kRows], sums[kRows];
  const double zero[kRows] = {};
  rows_reduce<false, kRows>(x, cols, zero, sums);
  for (int r = 0; r < kRows; ++r) m[r] = sums[r] / static_cast<double>(cols);
  rows_reduce<true, kRows>(x, cols, m, sums);
  for (int r = 0; r < kRows; ++r) {
    s[r] = 1.0 / std::sqrt(sums[r] / static_cast<double>(cols) + eps);
  }
  for (int r = 0; r < kRows; ++r) {
    const float* row = x + r * cols;
    float* out = y + r * cols;
    const __m512d mv = _mm512_set1_pd(m[r]), sv = _mm512_set1_pd(s[r]);
    std::int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      const __m256 normalized =
          _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_sub_pd(widen(row + j), mv), sv));
      const __m256 scaled = _mm256_mul_ps(normalized, _mm256_loadu_ps(weight + j));
      _mm256_storeu_ps(out + j, _mm256_add_ps(scaled, _mm256_loadu_ps(bias + j)));
    }
    for (; j < cols; ++j) {
      out[j] = static_cast<float>((row[j] - m[r]) * s[r]) * weight[j] + bias[j];
    }
    mean[r] = static_cast<float>(m[r]);
    rstd[r] = static_cast<float>(s[r]);
  }
}

}  // namespace

void layernorm_forward_avx512(const float* x, const float* weight, const float* bias,
                              std::int64_t rows, std::int64_t cols, float eps, float* y,
                              float* mean, float* rstd) {
  constexpr int kGroup = 4;
  std::int64_t r = 0;
  for (; r + kGroup <= rows; r += kGroup) {
    forward_rows<kGroup>(x + r * cols, weight, bias, cols, eps, y + r * cols, mean + r, rstd + r);
  }
  for (; r < rows; ++r) {
    forward_rows<1>(x + r * cols, weight, bias, cols, eps, y + r * cols, mean + r, rstd + r);
  }
}

void layernorm_backward_avx512(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, std::int64_t rows,
                               std::int64_t cols, float* dx, float* dweight, float* dbias) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* drow = dy + r * cols;
    const float* row = x + r * cols;
    float* dxrow = dx + r * cols;
    const float m = mean[r];
    const float s = rstd[r];
    const __m256 mv = _mm256_set1_ps(m), sv = _mm256_set1_ps(s);
    __m256 dnorm_sum = _mm256_setzero_ps(), dnorm_xhat_sum = _mm256_setzero_ps();
    std::int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv), sv);
      const __m256 dnorm = _mm256_mul_ps(_mm256_loadu_ps(drow + j), _mm256_loadu_ps(weight + j));
      dnorm_sum = _mm256_add_ps(dnorm_sum, dnorm);
      dnorm_xhat_sum = _mm256_add_ps(dnorm_xhat_sum, _mm256_mul_ps(dnorm, xhat));
    }
    alignas(32) float dnorm_lanes[kLanes], dnorm_xhat_lanes[kLanes];
    _mm256_store_ps(dnorm_lanes, dnorm_sum);
    _mm256_store_ps(dnorm_xhat_lanes, dnorm_xhat_sum);
    for (; j < cols; ++j) {
      const float xhat = (row[j] - m) * s;
      const float dnorm = drow[j] * weight[j];
      dnorm_lanes[j % kLanes] += dnorm;
      dnorm_xhat_lanes[j % kLanes] += dnorm * xhat;
    }
    const float dnorm_mean = fold(dnorm_lanes) * inv_cols;
    const float dnorm_xhat_mean = fold(dnorm_xhat_lanes) * inv_cols;
    const __m512 wm = _mm512_set1_ps(m), ws = _mm512_set1_ps(s);
    const __m512 dmv = _mm512_set1_ps(dnorm_mean), dxmv = _mm512_set1_ps(dnorm_xhat_mean);
    for (j = 0; j + kWide <= cols; j += kWide) {
      const __m512 d = _mm512_loadu_ps(drow + j);
      const __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(row + j), wm), ws);
      const __m512 dnorm = _mm512_mul_ps(d, _mm512_loadu_ps(weight + j));
      _mm512_storeu_ps(dbias + j, _mm512_add_ps(_mm512_loadu_ps(dbias + j), d));
      _mm512_storeu_ps(dweight + j,
                       _mm512_add_ps(_mm512_loadu_ps(dweight + j), _mm512_mul_ps(xhat, d)));
      const __m512 inner =
          _mm512_sub_ps(_mm512_sub_ps(dnorm, dmv), _mm512_mul_ps(xhat, dxmv));
      _mm512_storeu_ps(dxrow + j,
                       _mm512_add_ps(_mm512_loadu_ps(dxrow + j), _mm512_mul_ps(ws, inner)));
    }
    for (; j < cols; ++j) {
      const float xhat = (row[j] - m) * s;
      const float dnorm = drow[j] * weight[j];
      dbias[j] += drow[j];
      dweight[j] += xhat * drow[j];
      dxrow[j] += s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
    }
  }
}

}  // namespace zest::cpu
