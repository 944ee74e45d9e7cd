// Warp-level sums and maxima the row kernels (LayerNorm, softmax, cross-entropy) share, and the
// fixed-chunk column sums that keep parameter gradients deterministic. Each warp reduces in a
// fixed butterfly order, so a rerun gives the same bits. For .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace zest::cuda {

inline constexpr unsigned kWarpSize = 32;
// Rows whose column sums one thread adds up before the chunks are summed in order: small enough
// for a few hundred chunks (parallelism) on GPT's row counts, large enough to keep the
// workspace ([chunks, cols]) a small fraction of the activations.
inline constexpr std::int64_t kRowsPerChunk = 64;

template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
  for (unsigned offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  return value;
}

// The row of the calling warp where each block of `rows_per_block` warps takes one row a warp.
__device__ __forceinline__ std::int64_t warp_row(unsigned rows_per_block) {
  return static_cast<std::int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / kWarpSize;
}

__device__ __forceinline__ float warp_max(float value) {
  for (unsigned offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// Sum and max over a whole block (blockDim.x a multiple of 32, at most 1024), every thread gets
// the result: warps reduce, then the first warp reduces the warps' results in the same fixed
// order. Safe to call repeatedly (it synchronizes before reusing its shared memory).
template <typename T>
__device__ __forceinline__ T block_sum(T value) {
  __shared__ T warp_results[kWarpSize];
  const unsigned lane = threadIdx.x % kWarpSize;
  const unsigned warp = threadIdx.x / kWarpSize;
  value = warp_sum(value);
  __syncthreads();
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  value = lane < blockDim.x / kWarpSize ? warp_results[lane] : T(0);
  return warp_sum(value);
}

__device__ __forceinline__ float block_max(float value) {
  __shared__ float warp_results[kWarpSize];
  const unsigned lane = threadIdx.x % kWarpSize;
  const unsigned warp = threadIdx.x / kWarpSize;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) warp_results[warp] = value;
  __syncthreads();
  value = lane < blockDim.x / kWarpSize ? warp_results[lane] : -INFINITY;
  return warp_max(value);
}

__host__ __device__ inline std::int64_t chunk_count(std::int64_t rows) {
  return (rows + kRowsPerChunk - 1) / kRowsPerChunk;
}

// out[c] += sum over chunks, in chunk order, of partial[chunk * cols + c]: the second half of a
// deterministic column sum. One thread per column. A template only so that every .cu including
// this gets its own copy (no separable compilation).
template <typename T>
__global__ void add_chunk_sums(const T* __restrict__ partial, std::int64_t chunks,
                               std::int64_t cols, T* __restrict__ out) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  T sum = out[c];
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partial[chunk * cols + c];
  out[c] = sum;
}

}  // namespace zest::cuda
