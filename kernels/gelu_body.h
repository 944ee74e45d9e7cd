// What the GELU bodies share: kernels/gelu.cc (portable, and the dispatch), gelu_avx2.cc and
// gelu_avx512.cc. Not an interface; use kernels/gelu.h.
// Invariant: every body performs the portable body's fp32 operations (gelu.cc, gelu_forward_one
// and gelu_backward_one) in the same order, each rounded once, so all agree bit for bit.
// Note: plain declarations only, for the reason kernels/adamw_body.h gives (the SIMD files are
// built with -mavx2 / -mavx512f; an inline function they emitted could be the copy kept).
#pragma once

#include <cstddef>

namespace zest::cpu {

// The constants every body uses besides exp's (kernels/exp_body.h); see gelu.cc for
// kDerivativeClamp.
inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kGeluCubicTimes3 = 3.0f * 0.044715f;
inline constexpr float kDerivativeClamp = 10.0f;

void gelu_forward_portable(const float* x, float* y, std::size_t count);
void gelu_backward_portable(const float* x, const float* dy, float* dx, std::size_t count);
void gelu_forward_avx2(const float* x, float* y, std::size_t count);
void gelu_backward_avx2(const float* x, const float* dy, float* dx, std::size_t count);
void gelu_forward_avx512(const float* x, float* y, std::size_t count);
void gelu_backward_avx512(const float* x, const float* dy, float* dx, std::size_t count);

}  // namespace zest::cpu
