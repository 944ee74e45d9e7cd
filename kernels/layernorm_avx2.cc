// The LayerNorm bodies in AVX2; built with -mavx2 -mf16c -ffp-contract=off and run only where
// cpu_body_supported(kAvx2). The row sums keep layernorm.cc's eight lanes (two vectors of four
// doubles in the forward, one of eight floats in the backward) and fold them in its order; the
// elementwise loops do its operations lane by lane, each rounded once (no fused multiply-add), so
// the results are the portable body's bits. A row's last cols % 8 elements are done one by one.
#include <immintrin.h>

#include <cmath>

#include "kernels/layernorm_body.h"

namespace zest::cpu {
namespace {

constexpr std::int64_t kLanes = kLayerNormLanes;
static_assert(kLanes == 8, "one vector of floats, two of doubles");

template <typename T>
T fold(T* lanes) {
  for (std::int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (std::int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

inline __m256d widen(const float* p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }

// Sum of the row in double lanes; centered: sum of (row - m)^2.
template <bool kCentered>
double row_reduce(const float* row, std::int64_t cols, double m) {
  const __m256d mv = _mm256_set1_pd(m);
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  std::int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    __m256d a = widen(row + j), b = widen(row + j + 4);
    if constexpr (kCentered) {
      a = _mm256_sub_pd(a, mv);
      b = _mm256_sub_pd(b, mv);
      a = _mm256_mul_pd(a, a);
      b = _mm256_mul_pd(b, b);
    }
    low = _mm256_add_pd(low, a);
    high = _mm256_add_pd(high, b);
  }
  alignas(32) double lanes[kLanes];
  _mm256_store_pd(lanes, low);
  _mm256_store_pd(lanes + 4, high);
  for (; j < cols; ++j) {
    if constexpr (kCentered) {
      const double centered = row[j] - m;
      lanes[j % kLanes] += centered * centered;
    } else {
      lanes[j % kLanes] += row[j];
    }
  }
  return fold(lanes);
}

}  // namespace

void layernorm_forward_avx2(const float* x, const float* weight, const float* bias,
                            std::int64_t rows, std::int64_t cols, float eps, float* y, float* mean,
                            float* rstd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float* out = y + r * cols;
    const double m = row_reduce<false>(row, cols, 0.0) / static_cast<double>(cols);
    const double square_sum = row_reduce<true>(row, cols, m);
    const double s = 1.0 / std::sqrt(square_sum / static_cast<double>(cols) + eps);
    const __m256d mv = _mm256_set1_pd(m), sv = _mm256_set1_pd(s);
    std::int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      const __m128 a = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_sub_pd(widen(row + j), mv), sv));
      const __m128 b = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_sub_pd(widen(row + j + 4), mv), sv));
      const __m256 normalized = _mm256_set_m128(b, a);
      const __m256 scaled = _mm256_mul_ps(normalized, _mm256_loadu_ps(weight + j));
      _mm256_storeu_ps(out + j, _mm256_add_ps(scaled, _mm256_loadu_ps(bias + j)));
    }
    for (; j < cols; ++j) out[j] = static_cast<float>((row[j] - m) * s) * weight[j] + bias[j];
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(s);
  }
}

void layernorm_backward_avx2(const float* dy, const float* x, const float* weight,
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
    const __m256 dmv = _mm256_set1_ps(dnorm_mean), dxmv = _mm256_set1_ps(dnorm_xhat_mean);
    for (j = 0; j + kLanes <= cols; j += kLanes) {
      const __m256 d = _mm256_loadu_ps(drow + j);
      const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(row + j), mv), sv);
      const __m256 dnorm = _mm256_mul_ps(d, _mm256_loadu_ps(weight + j));
      _mm256_storeu_ps(dbias + j, _mm256_add_ps(_mm256_loadu_ps(dbias + j), d));
      _mm256_storeu_ps(dweight + j,
                       _mm256_add_ps(_mm256_loadu_ps(dweight + j), _mm256_mul_ps(xhat, d)));
      const __m256 inner =
          _mm256_sub_ps(_mm256_sub_ps(dnorm, dmv), _mm256_mul_ps(xhat, dxmv));
      _mm256_storeu_ps(dxrow + j,
                       _mm256_add_ps(_mm256_loadu_ps(dxrow + j), _mm256_mul_ps(sv, inner)));
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
