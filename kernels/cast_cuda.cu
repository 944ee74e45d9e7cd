#include "kernels/cast_cuda.h"

#include <algorithm>
#include <string>

#include "base/error.h"

// Note: a local check macro until runtime/ grows the shared ZEST_CUDA_CHECK header; it records
// the call, file and line the way STYLE.md asks.
#ifndef ZEST_CUDA_CHECK
#define ZEST_CUDA_CHECK(call)                                                                    \
  do {                                                                                           \
    cudaError_t zest_cuda_status_ = (call);                                                      \
    if (zest_cuda_status_ != cudaSuccess) {                                                      \
      throw ::zest::Error(::zest::ErrorKind::kDevice,                                            \
                          std::string("CUDA call ") + #call + " failed: " +                      \
                              cudaGetErrorName(zest_cuda_status_) + " (" +                       \
                              cudaGetErrorString(zest_cuda_status_) + ") at " + __FILE__ + ":" + \
                              std::to_string(__LINE__));                                         \
    }                                                                                            \
  } while (0)
#endif

namespace zest::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Note: the grid is capped and the kernels stride over the rest, so any count (including
// counts past 2^31) is covered without overflowing gridDim.x.
constexpr std::size_t kMaxBlocks = 4096;

__device__ __forceinline__ std::uint16_t round_to_bfloat16_bits(float value) {
  std::uint32_t word = __float_as_uint(value);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((word >> 16) | 0x40u);
  std::uint32_t rounding_bias = 0x7fffu + ((word >> 16) & 1u);
  return static_cast<std::uint16_t>((word + rounding_bias) >> 16);
}

__global__ void float_to_bfloat16_kernel(const float* __restrict__ in,
                                         std::uint16_t* __restrict__ out, std::size_t count) {
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = round_to_bfloat16_bits(in[i]);
  }
}

__global__ void bfloat16_to_float_kernel(const std::uint16_t* __restrict__ in,
                                         float* __restrict__ out, std::size_t count) {
  std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = __uint_as_float(static_cast<std::uint32_t>(in[i]) << 16);
  }
}

unsigned block_count(std::size_t count) {
  std::size_t blocks = (count + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(std::min(blocks, kMaxBlocks));
}

}  // namespace

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

}  // namespace zest::cuda
