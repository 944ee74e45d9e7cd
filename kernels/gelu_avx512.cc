// The GELU bodies in AVX-512, 16 lanes at a time; built with -mavx512f -ffp-contract=off and run
// only where cpu_body_supported(kAvx512). Each lane performs gelu.cc's portable operations in its
// order, each rounded once (no fused multiply-add; floor, division and the bit tricks are exact
// or correctly rounded), so the results are the portable body's bits; the last count % 16
// elements go through the portable body.
// Note: GCC 12 reports the placeholder vectors inside its AVX-512 intrinsics as maybe
// uninitialized (https://gcc.gnu.org/bugzilla/show_bug.cgi?id=105593), as adamw_avx512.cc says.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "kernels/exp_body.h"
#include "kernels/gelu_body.h"

namespace zest::cpu {
namespace {

constexpr std::size_t kLanes = 16;

inline __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
inline __m512 all(float c) { return _mm512_set1_ps(c); }

inline __m512 bits_andnot(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
inline __m512 bits_xor(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

struct Logistic {
  __m512 s, w, d;
};

// gelu.cc's logistic(): minps returns its second operand when either is NaN, so the value goes
// second to keep a NaN, as std::min(value, limit) does; negation flips the sign bit, as unary
// minus does (0 - x would turn -0 into +0).
inline Logistic logistic(__m512 v, __m512 v2) {
  const __m512 sign = all(-0.0f);
  const __m512 z =
      mul(all(-2.0f), mul(all(kGeluSqrt2OverPi), add(v, mul(mul(all(kGeluCubic), v2), v))));
  // AVX-512F has no andnot_ps / xor_ps (they are DQ): the same bits through integer lanes.
  const __m512 magnitude = _mm512_min_ps(all(kExpLimit), bits_andnot(sign, z));
  const __m512 w = exp_clamped(bits_xor(sign, magnitude));
  const __m512 d = add(all(1.0f), w);
  const __m512 numerator =
      _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, all(0.0f), _CMP_GT_OQ), all(1.0f), w);
  return {_mm512_div_ps(numerator, d), w, d};
}

}  // namespace

void gelu_forward_avx512(const float* x, float* y, std::size_t count) {
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(y + i, mul(v, logistic(v, mul(v, v)).s));
  }
  gelu_forward_portable(x + i, y + i, count - i);
}

void gelu_backward_avx512(const float* x, const float* dy, float* dx, std::size_t count) {
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const Logistic l = logistic(v, mul(v, v));
    const __m512 c =
        _mm512_min_ps(all(kDerivativeClamp), _mm512_max_ps(all(-kDerivativeClamp), v));
    const __m512 du = mul(all(kGeluSqrt2OverPi), add(all(1.0f), mul(all(kGeluCubicTimes3), mul(c, c))));
    const __m512 spread = _mm512_div_ps(_mm512_div_ps(l.w, l.d), l.d);
    const __m512 g = add(l.s, mul(mul(c, du), mul(all(2.0f), spread)));
    _mm512_storeu_ps(dx + i, mul(g, _mm512_loadu_ps(dy + i)));
  }
  gelu_backward_portable(x + i, dy + i, dx + i, count - i);
}

}  // namespace zest::cpu
