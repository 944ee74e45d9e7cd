// The softmax cross-entropy row bodies in AVX2, 16 elements (two vectors) at a time; built with
// -mavx2 -mf16c -ffp-contract=off and run only where cpu_body_supported(kAvx2). Lanes as
// kernels/cross_entropy_body.h lays them out, the same exp as the portable body
// (kernels/exp_body.h), the tail and the combining of lanes by the portable helpers: the
// portable body's bits.
#include <immintrin.h>

#include "kernels/cross_entropy_body.h"
#include "kernels/exp_body.h"

namespace zest::cpu {
namespace {

// max(z, -kExpLimit), keeping a NaN: maxps returns its second operand when either is NaN.
inline __m256 shifted(const float* x, __m256 max) {
  return _mm256_max_ps(_mm256_set1_ps(-kExpLimit), _mm256_sub_ps(_mm256_loadu_ps(x), max));
}

}  // namespace

float row_max_avx2(const float* row, std::int64_t classes) {
  __m256 low = _mm256_set1_ps(-__builtin_inff()), high = low;
  std::int64_t j = 0;
  for (; j + kRowLanes <= classes; j += kRowLanes) {
    low = _mm256_max_ps(low, _mm256_loadu_ps(row + j));
    high = _mm256_max_ps(high, _mm256_loadu_ps(row + j + 8));
  }
  alignas(32) float lanes[kRowLanes];
  _mm256_store_ps(lanes, low);
  _mm256_store_ps(lanes + 8, high);
  return finish_row_max(lanes, row, j, classes);
}

double row_exp_sum_avx2(const float* row, std::int64_t classes, float max) {
  const __m256 m = _mm256_set1_ps(max);
  __m256d sums[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                     _mm256_setzero_pd()};
  std::int64_t j = 0;
  for (; j + kRowLanes <= classes; j += kRowLanes) {
    const __m256 low = exp_clamped(shifted(row + j, m));
    const __m256 high = exp_clamped(shifted(row + j + 8, m));
    sums[0] = _mm256_add_pd(sums[0], _mm256_cvtps_pd(_mm256_castps256_ps128(low)));
    sums[1] = _mm256_add_pd(sums[1], _mm256_cvtps_pd(_mm256_extractf128_ps(low, 1)));
    sums[2] = _mm256_add_pd(sums[2], _mm256_cvtps_pd(_mm256_castps256_ps128(high)));
    sums[3] = _mm256_add_pd(sums[3], _mm256_cvtps_pd(_mm256_extractf128_ps(high, 1)));
  }
  alignas(32) double lanes[kRowLanes];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lanes + 4 * k, sums[k]);
  return finish_row_exp_sum(lanes, row, j, classes, max);
}

void row_softmax_avx2(const float* row, std::int64_t classes, float max, float inv_sum,
                      float scale, float* out) {
  const __m256 m = _mm256_set1_ps(max), inv = _mm256_set1_ps(inv_sum),
               s = _mm256_set1_ps(scale);
  std::int64_t j = 0;
  for (; j + 8 <= classes; j += 8) {
    const __m256 e = exp_clamped(shifted(row + j, m));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(e, inv), s));
  }
  softmax_tail(row, j, classes, max, inv_sum, scale, out);
}

}  // namespace zest::cpu
