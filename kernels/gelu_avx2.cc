// The GELU bodies in AVX2, 8 lanes at a time; built with -mavx2 -mf16c -ffp-contract=off and run
// only where cpu_body_supported(kAvx2). Each lane performs gelu.cc's portable operations in its
// order, each rounded once (no fused multiply-add; floor, division and the bit tricks are exact
// or correctly rounded), so the results are the portable body's bits; the last count % 8
// elements go through the portable body.
#include <immintrin.h>

#include "kernels/exp_body.h"
#include "kernels/gelu_body.h"

namespace zest::cpu {
namespace {

constexpr std::size_t kLanes = 8;

inline __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
inline __m256 all(float c) { return _mm256_set1_ps(c); }

struct Logistic {
  __m256 s, w, d;
};

// gelu.cc's logistic(): minps returns its second operand when either is NaN, so the value goes
// second to keep a NaN, as std::min(value, limit) does; negation flips the sign bit, as unary
// minus does (0 - x would turn -0 into +0).
inline Logistic logistic(__m256 v, __m256 v2) {
  const __m256 sign = all(-0.0f);
  const __m256 z =
      mul(all(-2.0f), mul(all(kGeluSqrt2OverPi), add(v, mul(mul(all(kGeluCubic), v2), v))));
  const __m256 magnitude = _mm256_min_ps(all(kExpLimit), _mm256_andnot_ps(sign, z));
  const __m256 w = exp_clamped(_mm256_xor_ps(sign, magnitude));
  const __m256 d = add(all(1.0f), w);
  const __m256 numerator = _mm256_blendv_ps(all(1.0f), w, _mm256_cmp_ps(z, all(0.0f), _CMP_GT_OQ));
  return {_mm256_div_ps(numerator, d), w, d};
}

}  // namespace

void gelu_forward_avx2(const float* x, float* y, std::size_t count) {
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, mul(v, logistic(v, mul(v, v)).s));
  }
  gelu_forward_portable(x + i, y + i, count - i);
}

void gelu_backward_avx2(const float* x, const float* dy, float* dx, std::size_t count) {
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const Logistic l = logistic(v, mul(v, v));
    const __m256 c =
        _mm256_min_ps(all(kDerivativeClamp), _mm256_max_ps(all(-kDerivativeClamp), v));
    const __m256 du = mul(all(kGeluSqrt2OverPi), add(all(1.0f), mul(all(kGeluCubicTimes3), mul(c, c))));
    const __m256 spread = _mm256_div_ps(_mm256_div_ps(l.w, l.d), l.d);
    const __m256 g = add(l.s, mul(mul(c, du), mul(all(2.0f), spread)));
    _mm256_storeu_ps(dx + i, mul(g, _mm256_loadu_ps(dy + i)));
  }
  gelu_backward_portable(x + i, dy + i, dx + i, count - i);
}

}  // namespace zest::cpu
