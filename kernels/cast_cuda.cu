#include "kernels/cast_cuda.h"

#include "base/cuda_check.h"
#include "kernels/launch_cuda.cuh"
#include "kernels/round_cuda.cuh"

namespace zest::cuda {
namespace {

__global__ void float_to_bfloat16_kernel(const float* __restrict__ in,
                                         std::uint16_t* __restrict__ out, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = round_to_bfloat16_bits(in[i]);
  }
}

__global__ void float_to_float16_kernel(const float* __restrict__ in,
                                        std::uint16_t* __restrict__ out, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = round_to_float16_bits(in[i]);
  }
}

__global__ void float16_to_float_kernel(const std::uint16_t* __restrict__ in,
                                        float* __restrict__ out, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = float16_bits_to_float(in[i]);
  }
}

__global__ void bfloat16_to_float_kernel(const std::uint16_t* __restrict__ in,
                                         float* __restrict__ out, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = __uint_as_float(static_cast<std::uint32_t>(in[i]) << 16);
  }
}

// Between the two 2-byte types through fp32, as the CPU body: widening is exact, so the one
// rounding is the destination's (bf16 -> fp16 can overflow to inf or lose subnormals).
__global__ void bfloat16_to_float16_kernel(const std::uint16_t* __restrict__ in,
                                           std::uint16_t* __restrict__ out, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = round_to_float16_bits(__uint_as_float(static_cast<std::uint32_t>(in[i]) << 16));
  }
}

__global__ void float16_to_bfloat16_kernel(const std::uint16_t* __restrict__ in,
                                           std::uint16_t* __restrict__ out, std::size_t count) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    out[i] = round_to_bfloat16_bits(float16_bits_to_float(in[i]));
  }
}

}  // namespace

void cast_bfloat16_to_float16(const std::uint16_t* in, std::uint16_t* out, std::size_t count,
                              cudaStream_t stream) {
  if (count == 0) return;
  bfloat16_to_float16_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(in, out, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cast_float16_to_bfloat16(const std::uint16_t* in, std::uint16_t* out, std::size_t count,
                              cudaStream_t stream) {
  if (count == 0) return;
  float16_to_bfloat16_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(in, out, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cast_float_to_bfloat16(const float* in, std::uint16_t* out, std::size_t count,
                            cudaStream_t stream) {
  if (count == 0) return;
  float_to_bfloat16_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(in, out, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cast_bfloat16_to_float(const std::uint16_t* in, float* out, std::size_t count,
                            cudaStream_t stream) {
  if (count == 0) return;
  bfloat16_to_float_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(in, out, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cast_float_to_float16(const float* in, std::uint16_t* out, std::size_t count,
                           cudaStream_t stream) {
  if (count == 0) return;
  float_to_float16_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(in, out, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cast_float16_to_float(const std::uint16_t* in, float* out, std::size_t count,
                           cudaStream_t stream) {
  if (count == 0) return;
  float16_to_float_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(in, out, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
