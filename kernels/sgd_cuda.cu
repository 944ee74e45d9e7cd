#include "kernels/sgd_cuda.h"

#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/launch_cuda.cuh"

namespace zest::cuda {
namespace {

enum class Mode { kPlain, kFirstMomentumStep, kMomentum };

// The constants of one call, as the CPU body reads them. nesterov: d = g + momentum*buf;
// otherwise d = buf; both written as from_grad*g + from_buf*buf, exact in each case.
struct SgdCoefficients {
  float grad_scale, weight_decay, lr, momentum, from_grad, from_buf;
};

// Note: __f*_rn intrinsics keep nvcc from fusing multiply-adds (the CPU body is built without
// contraction), so every value is rounded where the CPU body rounds it.
template <Mode kMode>
__device__ __forceinline__ void update(float& p, float g, float& buf, const SgdCoefficients& c) {
  const float grad = __fadd_rn(__fmul_rn(g, c.grad_scale), __fmul_rn(c.weight_decay, p));
  if constexpr (kMode == Mode::kPlain) {
    p = __fsub_rn(p, __fmul_rn(c.lr, grad));
  } else {
    const float b =
        kMode == Mode::kFirstMomentumStep ? grad : __fadd_rn(__fmul_rn(c.momentum, buf), grad);
    buf = b;
    p = __fsub_rn(p, __fmul_rn(c.lr, __fadd_rn(__fmul_rn(c.from_grad, grad),
                                               __fmul_rn(c.from_buf, b))));
  }
}

// `groups` runs of 4 with float4 access (0 when any array is unaligned), then the rest singly.
// The momentum buffer is untouched (and may be null) in kPlain.
template <Mode kMode>
__global__ void sgd_kernel(float* __restrict__ params, const float* __restrict__ grads,
                           float* __restrict__ momentum_buffer, std::size_t count,
                           std::size_t groups, SgdCoefficients c) {
  constexpr bool kBuffer = kMode != Mode::kPlain;
  for (std::size_t group = first_index(); group < groups; group += grid_stride()) {
    const std::size_t i = group * 4;
    float4 p = *reinterpret_cast<const float4*>(params + i);
    const float4 g = *reinterpret_cast<const float4*>(grads + i);
    float4 b = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (kMode == Mode::kMomentum) {
      b = *reinterpret_cast<const float4*>(momentum_buffer + i);
    }
    update<kMode>(p.x, g.x, b.x, c);
    update<kMode>(p.y, g.y, b.y, c);
    update<kMode>(p.z, g.z, b.z, c);
    update<kMode>(p.w, g.w, b.w, c);
    *reinterpret_cast<float4*>(params + i) = p;
    if constexpr (kBuffer) *reinterpret_cast<float4*>(momentum_buffer + i) = b;
  }
  for (std::size_t i = groups * 4 + first_index(); i < count; i += grid_stride()) {
    float p = params[i];
    float b = 0.0f;
    if constexpr (kMode == Mode::kMomentum) b = momentum_buffer[i];
    update<kMode>(p, grads[i], b, c);
    params[i] = p;
    if constexpr (kBuffer) momentum_buffer[i] = b;
  }
}

template <Mode kMode>
void launch(float* params, const float* grads, float* momentum_buffer, std::size_t count,
            const SgdCoefficients& c, cudaStream_t stream) {
  const bool aligned = aligned_to(params, 16) && aligned_to(grads, 16) &&
                       (kMode == Mode::kPlain || aligned_to(momentum_buffer, 16));
  const std::size_t groups = vector_groups(count, aligned);
  const std::size_t work = groups + (count - groups * 4);
  sgd_kernel<kMode><<<block_count(work), kThreadsPerBlock, 0, stream>>>(
      params, grads, momentum_buffer, count, groups, c);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void sgd(float* params, const float* grads, float* momentum_buffer, std::size_t count,
         const SgdArgs& args, cudaStream_t stream) {
  // The same checks and messages as the CPU body (kernels/sgd.cc).
  if (args.step < 1) {
    throw Error(ErrorKind::kUsage, "sgd: step must be >= 1, got " + std::to_string(args.step));
  }
  if (args.momentum != 0.0f && momentum_buffer == nullptr) {
    throw Error(ErrorKind::kUsage, "sgd: momentum > 0 needs a momentum buffer");
  }
  if (count == 0) return;
  const SgdCoefficients c{args.grad_scale,
                          args.weight_decay,
                          args.lr,
                          args.momentum,
                          args.nesterov ? 1.0f : 0.0f,
                          args.nesterov ? args.momentum : 1.0f};
  if (args.momentum == 0.0f) {
    launch<Mode::kPlain>(params, grads, momentum_buffer, count, c, stream);
  } else if (args.step == 1) {
    launch<Mode::kFirstMomentumStep>(params, grads, momentum_buffer, count, c, stream);
  } else {
    launch<Mode::kMomentum>(params, grads, momentum_buffer, count, c, stream);
  }
}

}  // namespace zest::cuda
