// What the elementwise CUDA kernels share: the launch shape (a capped grid whose threads stride
// over the rest, so any count, past 2^31 too, is one launch) and 16-byte vector access. A kernel
// takes `groups` = count / 4 when every array it touches is 16-byte aligned (0 otherwise), runs
// groups of 4 elements with float4 loads and stores, then the remaining elements one by one.
// For .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace zest::cuda {

inline constexpr unsigned kThreadsPerBlock = 256;
// Note: 4096 blocks of 256 threads fill an H200 (132 SMs, 2048 threads each) about four times
// over; more blocks only add scheduling for a memory-bound loop.
inline constexpr std::size_t kMaxBlocks = 4096;

// Blocks for `work` items, one per thread, capped at kMaxBlocks (at least 1).
inline unsigned block_count(std::size_t work) {
  const std::size_t blocks = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, kMaxBlocks));
}

inline bool aligned_to(const void* pointer, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

// Vector groups for `count` elements when `aligned`, else 0 (everything goes the scalar way).
inline std::size_t vector_groups(std::size_t count, bool aligned) {
  return aligned ? count / 4 : 0;
}

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

}  // namespace zest::cuda
