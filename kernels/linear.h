// A linear layer's forward with its neighbours fused where the device can: y = residual + x·Wᵀ
// + b (the GPT block's projections back into the residual stream, and its qkv product without a
// residual), and pre = x·Wᵀ + b, post = gelu(pre) (its MLP's first product, GELU in the tanh
// form). The CPU body runs the separate kernels (matmul, add_bias, gelu) in the order the block
// ran them before, so its results are unchanged; the CUDA body is one cuBLASLt product with a
// bias (and GELU) epilogue reading the residual as C: one pass over the output instead of three
// or four. The GELU epilogue only where the stream rounds its products to a 2-byte type
// (set_fp32_matmul_rounding); exact fp32 keeps the GELU kernel, the CPU's formula. Invariant: x, weight and bias are not written; y may be the residual (in place).
#pragma once

#include <cstdint>

#include "runtime/stream.h"

namespace zest {

// x: [rows, in]; weight: [out, in] (row-major, as torch.nn.Linear's); bias: [out];
// residual and y: [rows, out]; residual null: none. Throws kUsage, on the host, for a
// dimension below 1 (rows may be 0: nothing to do).
void linear_forward(Stream& stream, const float* x, const float* weight, const float* bias,
                    std::int64_t rows, std::int64_t in, std::int64_t out, const float* residual,
                    float* y);

// pre and post: [rows, out]; pre keeps x·Wᵀ + b for gelu_backward. post must not alias pre.
void linear_gelu_forward(Stream& stream, const float* x, const float* weight, const float* bias,
                         std::int64_t rows, std::int64_t in, std::int64_t out, float* pre,
                         float* post);

// Whether linear_gelu_forward's `post` on `stream` is gelu_forward(`pre`) bit for bit, so a
// layer that drops `post` may rebuild it from `pre` alone. It is, except where CUDA fuses the
// GELU into the product's epilogue (2-byte training, out a multiple of 8, bias and pre 16-byte
// aligned), whose tanh is cuBLASLt's own: there the layer runs linear_gelu_forward again.
bool linear_gelu_post_is_gelu_of_pre(Stream& stream, std::int64_t out);

}  // namespace zest
