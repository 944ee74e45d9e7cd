// GELU in the tanh form GPT-2 uses: gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// Backward WRITES dx = gelu'(x) * dy (it does not accumulate): a layer's input gradient is made
// fresh by the layer. Invariant: elementwise, so y may alias x and dx may alias x or dy (in
// place); all arrays hold `count` elements. Every CPU body (kernels/cpu_body.h) gives the same
// bits, on every run and any number of kernel threads.
#pragma once

#include <cstddef>

#include "kernels/cpu_body.h"
#include "runtime/stream.h"

namespace zest {

namespace cpu {

// With the process's body (selected_cpu_body()).
void gelu_forward(const float* x, float* y, std::size_t count);
void gelu_backward(const float* x, const float* dy, float* dx, std::size_t count);
// With a given body, which the caller has checked with cpu_body_supported().
void gelu_forward(CpuBody body, const float* x, float* y, std::size_t count);
void gelu_backward(CpuBody body, const float* x, const float* dy, float* dx, std::size_t count);

}  // namespace cpu

void gelu_forward(Stream& stream, const float* x, float* y, std::size_t count);
void gelu_backward(Stream& stream, const float* x, const float* dy, float* dx, std::size_t count);

}  // namespace zest
