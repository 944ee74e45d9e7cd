// The softmax cross-entropy row bodies in AVX-512F, 16 elements at a time; built with -mavx512f
// -ffp-contract=off and run only where cpu_body_supported(kAvx512). Lanes as
// kernels/cross_entropy_body.h lays them out, the same exp as the portable body
// (kernels/exp_body.h), the tail and the combining of lanes by the portable helpers: the
// portable body's bits.
// Note: GCC 12's AVX-512 intrinsics warn falsely, as adamw_avx512.cc says (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "kernels/cross_entropy_body.h"
#include "kernels/exp_body.h"

namespace zest::cpu {
namespace {

// max(z, -kExpLimit), keeping a NaN: maxps returns its second operand when either is NaN.
inline __m512 shifted(const float* x, __m512 max) {
  return _mm512_max_ps(_mm512_set1_ps(-kExpLimit), _mm512_sub_ps(_mm512_loadu_ps(x), max));
}

}  // namespace

float row_max_avx512(const float* row, std::int64_t classes) {
  __m512 lanes_max = _mm512_set1_ps(-__builtin_inff());
  std::int64_t j = 0;
  for (; j + kRowLanes <= classes; j += kRowLanes) {
    lanes_max = _mm512_max_ps(lanes_max, _mm512_loadu_ps(row + j));
  }
  alignas(64) float lanes[kRowLanes];
  _mm512_store_ps(lanes, lanes_max);
  return finish_row_max(lanes, row, j, classes);
}

double row_exp_sum_avx512(const float* row, std::int64_t classes, float max) {
  const __m512 m = _mm512_set1_ps(max);
  __m512d low_sum = _mm512_setzero_pd(), high_sum = _mm512_setzero_pd();
  std::int64_t j = 0;
  for (; j + kRowLanes <= classes; j += kRowLanes) {
    const __m512 e = exp_clamped(shifted(row + j, m));
    const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
    low_sum = _mm512_add_pd(low_sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    high_sum = _mm512_add_pd(high_sum, _mm512_cvtps_pd(high));
  }
  alignas(64) double lanes[kRowLanes];
  _mm512_store_pd(lanes, low_sum);
  _mm512_store_pd(lanes + 8, high_sum);
  return finish_row_exp_sum(lanes, row, j, classes, max);
}

void row_softmax_avx512(const float* row, std::int64_t classes, float max, float inv_sum,
                        float scale, float* out) {
  const __m512 m = _mm512_set1_ps(max), inv = _mm512_set1_ps(inv_sum),
               s = _mm512_set1_ps(scale);
  std::int64_t j = 0;
  for (; j + kRowLanes <= classes; j += kRowLanes) {
    const __m512 e = exp_clamped(shifted(row + j, m));
    _mm512_storeu_ps(out + j, _mm512_mul_ps(_mm512_mul_ps(e, inv), s));
  }
  softmax_tail(row, j, classes, max, inv_sum, scale, out);
}

}  // namespace zest::cpu
