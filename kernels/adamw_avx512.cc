// The AdamW body in AVX-512F, 16 lanes at a time; built with -mavx512f -ffp-contract=off and run
// only where cpu_body_supported(kAvx512). Every lane performs the portable body's operations in
// its order, each rounded once (no fused multiply-add), so results are bit-identical to it; the
// last count % 16 elements go through the portable body.
// Note: GCC 12 reports the placeholder ("undefined") vectors inside its own AVX-512 intrinsics as
// maybe uninitialized (https://gcc.gnu.org/bugzilla/show_bug.cgi?id=105593); the instructions
// overwrite every lane of them. The warning is off for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "kernels/adamw_body.h"

namespace zest::cpu {
namespace {

constexpr std::size_t kLanes = 16;

struct Lanes {
  __m512 grad_scale, l2, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
  __m512 step_size, inv_sqrt_bias_correction2, eps;
};

Lanes broadcast(const AdamCoefficients& c) {
  return {_mm512_set1_ps(c.grad_scale),      _mm512_set1_ps(c.l2),
          _mm512_set1_ps(c.decay),           _mm512_set1_ps(c.beta1),
          _mm512_set1_ps(c.one_minus_beta1), _mm512_set1_ps(c.beta2),
          _mm512_set1_ps(c.one_minus_beta2), _mm512_set1_ps(c.step_size),
          _mm512_set1_ps(c.inv_sqrt_bias_correction2), _mm512_set1_ps(c.eps)};
}

// Updates 16 elements at i and returns the new parameters.
inline __m512 update(float* p, const float* g, float* m, float* v, std::size_t i, const Lanes& c) {
  const __m512 param = _mm512_loadu_ps(p + i);
  const __m512 grad = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(g + i), c.grad_scale),
                                    _mm512_mul_ps(c.l2, param));
  const __m512 mi = _mm512_add_ps(_mm512_mul_ps(c.beta1, _mm512_loadu_ps(m + i)),
                                  _mm512_mul_ps(c.one_minus_beta1, grad));
  const __m512 vi = _mm512_add_ps(_mm512_mul_ps(c.beta2, _mm512_loadu_ps(v + i)),
                                  _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, grad), grad));
  _mm512_storeu_ps(m + i, mi);
  _mm512_storeu_ps(v + i, vi);
  const __m512 denom =
      _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), c.inv_sqrt_bias_correction2), c.eps);
  const __m512 updated = _mm512_sub_ps(_mm512_mul_ps(param, c.decay),
                                       _mm512_div_ps(_mm512_mul_ps(c.step_size, mi), denom));
  _mm512_storeu_ps(p + i, updated);
  return updated;
}

// BFloat16::round_to_bits on 16 lanes: add 0x7fff plus the kept lowest bit, keep the high half;
// a NaN becomes its high half with the quiet bit set.
inline __m256i round_to_bfloat16(__m512 x) {
  const __m512i word = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(word, 16);
  const __m512i bias =
      _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(word, bias), 16);
  const __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
}

// Float16::round_to_bits on 16 lanes: the hardware conversion rounds to nearest even with the
// same overflow and subnormal results, but keeps a NaN's payload where Float16 writes the
// canonical 0x7e00, so a NaN is made canonical (same sign) first.
inline __m256i round_to_float16(__m512 x) {
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  const __m512i canonical_nan = _mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512 fixed = _mm512_mask_mov_ps(x, is_nan, _mm512_castsi512_ps(canonical_nan));
  return _mm512_cvtps_ph(fixed, _MM_FROUND_TO_NEAREST_INT);
}

enum class Copy { kNone, kBFloat16, kFloat16 };

template <Copy copy>
void run(float* p, const float* g, float* m, float* v, std::size_t count,
         const AdamCoefficients& c, std::uint16_t* rounded, DType rounded_dtype) {
  const Lanes lanes = broadcast(c);
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m512 updated = update(p, g, m, v, i, lanes);
    if constexpr (copy == Copy::kBFloat16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rounded + i), round_to_bfloat16(updated));
    } else if constexpr (copy == Copy::kFloat16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rounded + i), round_to_float16(updated));
    }
  }
  if (i < count) {
    adamw_portable(p + i, g + i, m + i, v + i, count - i, c,
                   copy == Copy::kNone ? nullptr : rounded + i, rounded_dtype);
  }
}

}  // namespace

void adamw_avx512(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                  std::size_t count, const AdamCoefficients& c, std::uint16_t* rounded,
                  DType rounded_dtype) {
  if (rounded == nullptr) {
    run<Copy::kNone>(params, grads, exp_avg, exp_avg_sq, count, c, rounded, rounded_dtype);
  } else if (rounded_dtype == DType::kBFloat16) {
    run<Copy::kBFloat16>(params, grads, exp_avg, exp_avg_sq, count, c, rounded, rounded_dtype);
  } else {
    run<Copy::kFloat16>(params, grads, exp_avg, exp_avg_sq, count, c, rounded, rounded_dtype);
  }
}

}  // namespace zest::cpu
