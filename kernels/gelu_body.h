// What the GELU bodies share: kernels/gelu.cc (portable, and the dispatch), gelu_avx2.cc and
// gelu_avx512.cc. Not an interface; use kernels/gelu.h.
// Invariant: every body performs the portable body's fp32 operations (gelu.cc, gelu_forward_one
// and gelu_backward_one) in the same order, each rounded once, so all agree bit for bit.
// Note: plain declarations only, for the reason kernels/adamw_body.h gives (the SIMD files are
// built with -mavx2 / -mavx512f; an inline function they emitted could be the copy kept).
#pragma once

#include <cstddef>

namespace zest::cpu {

// The constants every body uses. exp's argument is clamped to [-kExpLimit, 0], where 2^n of its
// range reduction is a normal float or zero; see gelu.cc for kDerivativeClamp.
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kGeluCubicTimes3 = 3.0f * 0.044715f;
inline constexpr float kExpLimit = 88.0f;
inline constexpr float kDerivativeClamp = 10.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
// Cephes' expf: ln 2 in two parts (the first with few bits, so that n * kLn2High is exact), and
// the minimax polynomial of exp(r) on |r| <= ln(2)/2, relative error about 1 ulp.
inline constexpr float kLn2High = 0.693359375f;
inline constexpr float kLn2Low = -2.12194440e-4f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;
// Adding it to an integer-valued float k in [0, 2^22) leaves k in the low mantissa bits.
inline constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23

void gelu_forward_portable(const float* x, float* y, std::size_t count);
void gelu_backward_portable(const float* x, const float* dy, float* dx, std::size_t count);
void gelu_forward_avx2(const float* x, float* y, std::size_t count);
void gelu_backward_avx2(const float* x, const float* dy, float* dx, std::size_t count);
void gelu_forward_avx512(const float* x, float* y, std::size_t count);
void gelu_backward_avx512(const float* x, const float* dy, float* dx, std::size_t count);

}  // namespace zest::cpu
