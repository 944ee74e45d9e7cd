// What the AdamW bodies share: kernels/adamw.cc (portable, and the dispatch), adamw_avx2.cc,
// adamw_avx512.cc and the CUDA body, adamw_cuda.cu. Not an interface; use kernels/adamw.h.
// Invariant: every body performs the same fp32 operations, in the same order, as the portable
// update_block in adamw.cc.
// Note: the SIMD files are compiled with -mavx2 / -mavx512f, so they must not emit any inline
// function or template that other files emit too: the linker keeps one copy, which could be the
// AVX one run on a CPU without AVX. Hence plain data and function declarations only here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"

namespace zest {
struct AdamWArgs;
struct RoundedCopy;
}  // namespace zest

namespace zest::cpu {

// Per-call constants, computed once in double as PyTorch does on the host, then rounded.
struct AdamCoefficients {
  float grad_scale, l2, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size, inv_sqrt_bias_correction2, eps;
};

// The constants of one call, as every body uses them (the CUDA body too: kernels/adamw_cuda.cu).
AdamCoefficients adam_coefficients(const AdamWArgs& args);
// Throws a kUsage Error for step < 1 or a copy dtype that is not 2-byte.
void check_adamw_args(const AdamWArgs& args, RoundedCopy copy);

// Updates [0, count) and, when `rounded` is not null, writes the updated parameters rounded to
// nearest even to `rounded` as `rounded_dtype` (kBFloat16 or kFloat16; NaN as base/dtype.h).
using AdamWBodyFunction = void (*)(float* params, const float* grads, float* exp_avg,
                                   float* exp_avg_sq, std::size_t count,
                                   const AdamCoefficients& c, std::uint16_t* rounded,
                                   DType rounded_dtype);

void adamw_portable(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                    std::size_t count, const AdamCoefficients& c, std::uint16_t* rounded,
                    DType rounded_dtype);
void adamw_avx2(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                std::size_t count, const AdamCoefficients& c, std::uint16_t* rounded,
                DType rounded_dtype);
void adamw_avx512(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                  std::size_t count, const AdamCoefficients& c, std::uint16_t* rounded,
                  DType rounded_dtype);

}  // namespace zest::cpu
