// The fp32 sum of squares of the gradient statistics in AVX-512, its eight double lanes as
// one vector of eight doubles; built with -mavx512f -ffp-contract=off and run only where
// cpu_body_supported() says so. The squares are exact in double and the additions are the
// portable body's, lane by lane and folded in its order, so the result is its bits.
// Note: GCC 12 reports the placeholder vectors inside its AVX-512 intrinsics as maybe
// uninitialized (https://gcc.gnu.org/bugzilla/show_bug.cgi?id=105593), as adamw_avx512.cc says.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "kernels/gradient_statistics_body.h"

namespace zest::cpu {

double sum_of_squares_avx512(const float* values, std::size_t count) {
  __m512d sum = _mm512_setzero_pd();
  std::size_t i = 0;
  for (; i + kStatisticsLanes <= count; i += kStatisticsLanes) {
    const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(values + i));
    sum = _mm512_add_pd(sum, _mm512_mul_pd(a, a));
  }
  alignas(64) double lanes[kStatisticsLanes];
  _mm512_store_pd(lanes, sum);
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
