// Layer normalization over the last axis of a [rows, cols] matrix, y = (x - mean) * rstd * weight
// + bias with rstd = 1 / sqrt(var + eps) (biased variance, as torch.nn.LayerNorm). Forward keeps
// each row's mean and rstd for backward. Invariant: backward ACCUMULATES into dx, dweight and
// dbias (dx += ..., so a residual's gradient can be summed in place; zero dx first otherwise).
#pragma once

#include <cstdint>

#include "kernels/cpu_body.h"
#include "runtime/stream.h"

namespace zest {

inline constexpr float kLayerNormEps = 1e-5f;  // GPT-2's epsilon

namespace cpu {

// x, y: [rows, cols]; weight, bias: [cols]; mean, rstd: [rows] (written, for backward).
void layernorm_forward(const float* x, const float* weight, const float* bias, std::int64_t rows,
                       std::int64_t cols, float eps, float* y, float* mean, float* rstd);
// dy, x, dx: [rows, cols]; dweight, dbias: [cols]; mean, rstd from forward. dx must not alias
// dy or x.
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, std::int64_t rows, std::int64_t cols, float* dx,
                        float* dweight, float* dbias);
// The same with a chosen body (kernels/cpu_body.h); the two above run selected_cpu_body(). Every
// body gives the same bits.
void layernorm_forward(CpuBody body, const float* x, const float* weight, const float* bias,
                       std::int64_t rows, std::int64_t cols, float eps, float* y, float* mean,
                       float* rstd);
void layernorm_backward(CpuBody body, const float* dy, const float* x, const float* weight,
                        const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t cols, float* dx, float* dweight, float* dbias);

}  // namespace cpu

// Throw a kUsage Error, on the host, unless rows >= 0 and cols >= 1.
void layernorm_forward(Stream& stream, const float* x, const float* weight, const float* bias,
                       std::int64_t rows, std::int64_t cols, float eps, float* y, float* mean,
                       float* rstd);
void layernorm_backward(Stream& stream, const float* dy, const float* x, const float* weight,
                        const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t cols, float* dx, float* dweight, float* dbias);

}  // namespace zest
