// The exp that the CPU bodies of GELU and softmax cross-entropy share, in a scalar, an AVX2 and an
// AVX-512 form that give the same bits: Cephes' expf (range reduction by ln 2 in two parts, a
// degree-6 minimax polynomial, about 1 ulp), each operation rounded once (the files that use it
// are built with -ffp-contract=off). Not an interface; include it from kernels/ only.
// Invariant: z must be in [-kExpLimit, 0] or NaN; below about -87.7 the result is +0.
// Note: everything here has internal linkage (an unnamed namespace): the copy that a file built
// with -mavx2 or -mavx512f compiles must never be the one a baseline file runs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace zest::cpu {
namespace {  // NOLINT(build/namespaces): see the note above

constexpr float kExpLimit = 88.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f;  // few bits, so that n * kLn2High is exact
constexpr float kLn2Low = -2.12194440e-4f;
constexpr float kExpP0 = 1.9875691500e-4f;
constexpr float kExpP1 = 1.3981999507e-3f;
constexpr float kExpP2 = 8.3334519073e-3f;
constexpr float kExpP3 = 4.1665795894e-2f;
constexpr float kExpP4 = 1.6666665459e-1f;
constexpr float kExpP5 = 5.0000001201e-1f;
// Adding it to an integer-valued float k in [0, 2^22) leaves k in the low mantissa bits.
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23

inline float exp_clamped(float z) {
  const float n = std::floor(z * kLog2e + 0.5f);
  float r = z - n * kLn2High;
  r = r - n * kLn2Low;
  float p = kExpP0;
  p = p * r + kExpP1;
  p = p * r + kExpP2;
  p = p * r + kExpP3;
  p = p * r + kExpP4;
  p = p * r + kExpP5;
  p = p * (r * r) + r + 1.0f;
  // 2^n from the exponent field; n = -127 gives +0, as the true value underflows anyway.
  const float shifted = (n + 127.0f) + kRoundMagic;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits <<= 23;
  float scale = 0.0f;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#if defined(__AVX2__)
inline __m256 exp_clamped(__m256 z) {
  const auto all = [](float c) { return _mm256_set1_ps(c); };
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(z, all(kLog2e)), all(0.5f)));
  __m256 r = _mm256_sub_ps(z, _mm256_mul_ps(n, all(kLn2High)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, all(kLn2Low)));
  __m256 p = all(kExpP0);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), all(kExpP1));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), all(kExpP2));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), all(kExpP3));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), all(kExpP4));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), all(kExpP5));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), all(1.0f));
  const __m256i biased =
      _mm256_castps_si256(_mm256_add_ps(_mm256_add_ps(n, all(127.0f)), all(kRoundMagic)));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
}
#endif

#if defined(__AVX512F__)
inline __m512 exp_clamped(__m512 z) {
  const auto all = [](float c) { return _mm512_set1_ps(c); };
  const __m512 n = _mm512_roundscale_ps(_mm512_add_ps(_mm512_mul_ps(z, all(kLog2e)), all(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_sub_ps(z, _mm512_mul_ps(n, all(kLn2High)));
  r = _mm512_sub_ps(r, _mm512_mul_ps(n, all(kLn2Low)));
  __m512 p = all(kExpP0);
  p = _mm512_add_ps(_mm512_mul_ps(p, r), all(kExpP1));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), all(kExpP2));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), all(kExpP3));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), all(kExpP4));
  p = _mm512_add_ps(_mm512_mul_ps(p, r), all(kExpP5));
  p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), all(1.0f));
  const __m512i biased =
      _mm512_castps_si512(_mm512_add_ps(_mm512_add_ps(n, all(127.0f)), all(kRoundMagic)));
  return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23)));
}
#endif

}  // namespace
}  // namespace zest::cpu
