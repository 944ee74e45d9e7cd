// The AdamW body in AVX2, 8 lanes at a time; built with -mavx2 -mf16c -ffp-contract=off and
// run only where cpu_body_supported(kAvx2). Every lane performs the portable body's operations in
// its order, each rounded once (no fused multiply-add), so results are bit-identical to it; the
// last count % 8 elements go through the portable body.
#include <immintrin.h>

#include "kernels/adamw_body.h"

namespace zest::cpu {
namespace {

constexpr std::size_t kLanes = 8;

struct Lanes {
  __m256 grad_scale, l2, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
  __m256 step_size, inv_sqrt_bias_correction2, eps;
};

Lanes broadcast(const AdamCoefficients& c) {
  return {_mm256_set1_ps(c.grad_scale),      _mm256_set1_ps(c.l2),
          _mm256_set1_ps(c.decay),           _mm256_set1_ps(c.beta1),
          _mm256_set1_ps(c.one_minus_beta1), _mm256_set1_ps(c.beta2),
          _mm256_set1_ps(c.one_minus_beta2), _mm256_set1_ps(c.step_size),
          _mm256_set1_ps(c.inv_sqrt_bias_correction2), _mm256_set1_ps(c.eps)};
}

// Updates 8 elements at i and returns the new parameters.
inline __m256 update(float* p, const float* g, float* m, float* v, std::size_t i, const Lanes& c) {
  const __m256 param = _mm256_loadu_ps(p + i);
  const __m256 grad = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(g + i), c.grad_scale),
                                    _mm256_mul_ps(c.l2, param));
  const __m256 mi = _mm256_add_ps(_mm256_mul_ps(c.beta1, _mm256_loadu_ps(m + i)),
                                  _mm256_mul_ps(c.one_minus_beta1, grad));
  const __m256 vi = _mm256_add_ps(_mm256_mul_ps(c.beta2, _mm256_loadu_ps(v + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, grad), grad));
  _mm256_storeu_ps(m + i, mi);
  _mm256_storeu_ps(v + i, vi);
  const __m256 denom =
      _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), c.inv_sqrt_bias_correction2), c.eps);
  const __m256 updated = _mm256_sub_ps(_mm256_mul_ps(param, c.decay),
                                       _mm256_div_ps(_mm256_mul_ps(c.step_size, mi), denom));
  _mm256_storeu_ps(p + i, updated);
  return updated;
}

// BFloat16::round_to_bits on 8 lanes: add 0x7fff plus the kept lowest bit, keep the high half;
// a NaN becomes its high half with the quiet bit set.
inline __m128i round_to_bfloat16(__m256 x) {
  const __m256i word = _mm256_castps_si256(x);
  const __m256i high = _mm256_srli_epi32(word, 16);
  const __m256i bias =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(word, bias), 16);
  const __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i bits = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
}

// Float16::round_to_bits on 8 lanes: F16C rounds to nearest even with the same overflow and
// subnormal results, but keeps a NaN's payload where Float16 writes the canonical 0x7e00, so a
// NaN is made canonical (same sign) first.
inline __m128i round_to_float16(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN)));
  const __m256 canonical_nan =
      _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  const __m256 fixed = _mm256_blendv_ps(x, canonical_nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_cvtps_ph(fixed, _MM_FROUND_TO_NEAREST_INT);
}

enum class Copy { kNone, kBFloat16, kFloat16 };

template <Copy copy>
void run(float* p, const float* g, float* m, float* v, std::size_t count,
         const AdamCoefficients& c, std::uint16_t* rounded, DType rounded_dtype) {
  const Lanes lanes = broadcast(c);
  std::size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const __m256 updated = update(p, g, m, v, i, lanes);
    if constexpr (copy == Copy::kBFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(rounded + i), round_to_bfloat16(updated));
    } else if constexpr (copy == Copy::kFloat16) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(rounded + i), round_to_float16(updated));
    }
  }
  if (i < count) {
    adamw_portable(p + i, g + i, m + i, v + i, count - i, c,
                   copy == Copy::kNone ? nullptr : rounded + i, rounded_dtype);
  }
}

}  // namespace

void adamw_avx2(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
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
