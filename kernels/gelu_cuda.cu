#include "kernels/gelu_cuda.h"

#include "base/cuda_check.h"
#include "kernels/launch_cuda.cuh"

namespace zest::cuda {
namespace {

// kernels/gelu.cc's constants.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// tanh(sqrt(2/pi) (v + 0.044715 v^3)), rounded where the CPU body rounds.
__device__ __forceinline__ float inner_tanh(float v) {
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(kCubic, v), v), v);
  return tanhf(__fmul_rn(kSqrt2OverPi, __fadd_rn(v, cube)));
}

__device__ __forceinline__ float gelu(float v) {
  return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, inner_tanh(v)));
}

__device__ __forceinline__ float gelu_grad(float v, float dy) {
  const float t = inner_tanh(v);
  const float poly = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(__fmul_rn(3.0f, kCubic), v), v));
  const float dt = __fmul_rn(__fmul_rn(kSqrt2OverPi, poly), __fsub_rn(1.0f, __fmul_rn(t, t)));
  const float left = __fmul_rn(0.5f, __fadd_rn(1.0f, t));
  const float right = __fmul_rn(__fmul_rn(0.5f, v), dt);
  return __fmul_rn(__fadd_rn(left, right), dy);
}

// Note: no __restrict__ and no float4 here: y may alias x and dx may alias x or dy (the GPT's
// backward runs gelu_backward in place), and GELU is cheap next to the products around it.
__global__ void forward_kernel(const float* x, float* y, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) y[i] = gelu(x[i]);
}

__global__ void backward_kernel(const float* x, const float* dy, float* dx, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    dx[i] = gelu_grad(x[i], dy[i]);
  }
}

}  // namespace

void gelu_forward(const float* x, float* y, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  forward_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(x, y, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void gelu_backward(const float* x, const float* dy, float* dx, std::size_t count,
                   cudaStream_t stream) {
  if (count == 0) return;
  backward_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(x, dy, dx, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
