#include "kernels/gelu.h"

#include <cmath>

#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/gelu_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

}  // namespace

namespace cpu {

void gelu_forward(const float* x, float* y, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const float v = x[i];
    const float t = std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

void gelu_backward(const float* x, const float* dy, float* dx, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const float v = x[i];
    const float t = std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v));
    const float dt = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v) * (1.0f - t * t);
    dx[i] = (0.5f * (1.0f + t) + 0.5f * v * dt) * dy[i];
  }
}

}  // namespace cpu

void gelu_forward(Stream& stream, const float* x, float* y, std::size_t count) {
  if (count == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::gelu_forward(x, y, count, cuda::stream_handle(stream, "gelu_forward"));
    return;
  }
#endif
  dispatch_kernel(stream, "gelu_forward", [=] { cpu::gelu_forward(x, y, count); });
}

void gelu_backward(Stream& stream, const float* x, const float* dy, float* dx, std::size_t count) {
  if (count == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::gelu_backward(x, dy, dx, count, cuda::stream_handle(stream, "gelu_backward"));
    return;
  }
#endif
  dispatch_kernel(stream, "gelu_backward", [=] { cpu::gelu_backward(x, dy, dx, count); });
}

}  // namespace zest
