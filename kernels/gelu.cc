#include "kernels/gelu.h"

#include <algorithm>
#include <cmath>

#include "kernels/dispatch.h"
#include "kernels/exp_body.h"
#include "kernels/gelu_body.h"
#include "kernels/kernel_threads.h"

#if ZEST_HAVE_CUDA
#include "kernels/gelu_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace cpu {
namespace {

// Note: GELU is written through the logistic function, 0.5 (1 + tanh(u)) = s = 1 / (1 + exp(-2u)),
// so that neither direction subtracts nearly equal numbers (1 + tanh u rounds to 0 near x = -5;
// exp does not lose digits), and exp is taken of -|2u| only: w = exp(-|2u|) is in [0, 1], so
// s = 1 / (1 + w) for u >= 0 and s = w / (1 + w) for u < 0 never overflow, and
// s (1 - s) = w / (1 + w)^2 either way. One exp (Cephes' range reduction and polynomial, no
// libm call: kernels/exp_body.h) and three divisions an element, which the SIMD bodies repeat
// lane by lane exactly.
struct Logistic {
  float s;   // 1 / (1 + exp(-2u))
  float w;   // exp(-|2u|)
  float d;   // 1 + w
};

// u = sqrt(2/pi) (x + 0.044715 x^3). std::min returns its first argument when the comparison
// is false, so a NaN stays NaN, as minps with the operands in the SIMD bodies' order does.
inline Logistic logistic(float v, float v2) {
  const float z = -2.0f * (kGeluSqrt2OverPi * (v + kGeluCubic * v2 * v));
  const float w = exp_clamped(-std::min(std::abs(z), kExpLimit));
  const float d = 1.0f + w;
  return {(z > 0.0f ? w : 1.0f) / d, w, d};
}

inline float gelu_forward_one(float v) { return v * logistic(v, v * v).s; }

// gelu'(x) = s + x u'(x) 2 s (1 - s). x u'(x) takes x clamped to [-kDerivativeClamp, ...]: past
// it s (1 - s) is below 1e-38 (or 0), and x^2 of a huge x would make inf * 0.
inline float gelu_backward_one(float v, float dy) {
  const Logistic l = logistic(v, v * v);
  const float c = std::min(std::max(v, -kDerivativeClamp), kDerivativeClamp);
  const float du = kGeluSqrt2OverPi * (1.0f + kGeluCubicTimes3 * (c * c));
  const float g = l.s + (c * du) * (2.0f * ((l.w / l.d) / l.d));
  return g * dy;
}

// Below this many elements a kernel call stays on one thread (about 0.1 ms of work).
constexpr std::size_t kMinElementsPerThread = std::size_t{1} << 15;

using ForwardBody = void (*)(const float*, float*, std::size_t);
using BackwardBody = void (*)(const float*, const float*, float*, std::size_t);

ForwardBody forward_body(CpuBody body) {
  switch (body) {
#if defined(ZEST_HAVE_X86_BODIES)
    case CpuBody::kAvx512: return gelu_forward_avx512;
    case CpuBody::kAvx2: return gelu_forward_avx2;
#else
    case CpuBody::kAvx512:
    case CpuBody::kAvx2:
#endif
    case CpuBody::kPortable: break;
  }
  return gelu_forward_portable;
}

BackwardBody backward_body(CpuBody body) {
  switch (body) {
#if defined(ZEST_HAVE_X86_BODIES)
    case CpuBody::kAvx512: return gelu_backward_avx512;
    case CpuBody::kAvx2: return gelu_backward_avx2;
#else
    case CpuBody::kAvx512:
    case CpuBody::kAvx2:
#endif
    case CpuBody::kPortable: break;
  }
  return gelu_backward_portable;
}

}  // namespace

void gelu_forward_portable(const float* x, float* y, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) y[i] = gelu_forward_one(x[i]);
}

void gelu_backward_portable(const float* x, const float* dy, float* dx, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) dx[i] = gelu_backward_one(x[i], dy[i]);
}

void gelu_forward(CpuBody body, const float* x, float* y, std::size_t count) {
  const ForwardBody run = forward_body(body);
  parallel_blocks(count, kMinElementsPerThread,
                  [&](std::size_t i, std::size_t n) { run(x + i, y + i, n); });
}

void gelu_backward(CpuBody body, const float* x, const float* dy, float* dx, std::size_t count) {
  const BackwardBody run = backward_body(body);
  parallel_blocks(count, kMinElementsPerThread,
                  [&](std::size_t i, std::size_t n) { run(x + i, dy + i, dx + i, n); });
}

void gelu_forward(const float* x, float* y, std::size_t count) {
  gelu_forward(selected_cpu_body(), x, y, count);
}

void gelu_backward(const float* x, const float* dy, float* dx, std::size_t count) {
  gelu_backward(selected_cpu_body(), x, dy, dx, count);
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
  const CpuBody body = selected_cpu_body();
  dispatch_kernel(stream, "gelu_forward", [=] { cpu::gelu_forward(body, x, y, count); });
}

void gelu_backward(Stream& stream, const float* x, const float* dy, float* dx, std::size_t count) {
  if (count == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::gelu_backward(x, dy, dx, count, cuda::stream_handle(stream, "gelu_backward"));
    return;
  }
#endif
  const CpuBody body = selected_cpu_body();
  dispatch_kernel(stream, "gelu_backward", [=] { cpu::gelu_backward(body, x, dy, dx, count); });
}

}  // namespace zest
