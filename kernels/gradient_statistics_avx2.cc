// The fp32 sum of squares of the gradient statistics in AVX2, its eight double lanes as
// two vectors of four doubles; built with -mavx2 -mf16c -ffp-contract=off and run only where
// cpu_body_supported() says so. The squares are exact in double and the additions are the
// portable body's, lane by lane and folded in its order, so the result is its bits.

#include <immintrin.h>

#include "kernels/gradient_statistics_body.h"

namespace zest::cpu {

double sum_of_squares_avx2(const float* values, std::size_t count) {
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  std::size_t i = 0;
  for (; i + kStatisticsLanes <= count; i += kStatisticsLanes) {
    const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(values + i));
    const __m256d b = _mm256_cvtps_pd(_mm_loadu_ps(values + i + 4));
    low = _mm256_add_pd(low, _mm256_mul_pd(a, a));
    high = _mm256_add_pd(high, _mm256_mul_pd(b, b));
  }
  alignas(32) double lanes[kStatisticsLanes];
  _mm256_store_pd(lanes, low);
  _mm256_store_pd(lanes + 4, high);
  for (; i < count; ++i) {
    const double value = values[i];
    lanes[i % kStatisticsLanes] += value * value;
  }
  for (std::size_t width = kStatisticsLanes / 2; width >= 1; width /= 2) {
    for (std::size_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

}  // namespace zest::cpu
