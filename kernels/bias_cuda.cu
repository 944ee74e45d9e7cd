#include "kernels/bias_cuda.h"

#include <algorithm>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/launch_cuda.cuh"
#include "kernels/reduce_cuda.cuh"

namespace zest::cuda {
namespace {

constexpr unsigned kColumnThreads = 256;
constexpr std::int64_t kMaxGridY = 65535;  // CUDA's limit; more chunks loop

void check_shape(const char* kernel, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + " (CUDA): negative shape [" +
                                       std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                std::size_t count, std::int64_t cols) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    y[i] += bias[static_cast<std::int64_t>(i) % cols];
  }
}

// partial[chunk, c] = sum of dy[r, c] over the chunk's rows, in row order.
__global__ void column_partials_kernel(const float* __restrict__ dy, std::int64_t rows,
                                       std::int64_t cols, float* __restrict__ partial) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const std::int64_t chunks = chunk_count(rows);
  for (std::int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const std::int64_t end = min(rows, (chunk + 1) * kRowsPerChunk);
    float sum = 0.0f;
    for (std::int64_t r = chunk * kRowsPerChunk; r < end; ++r) sum += dy[r * cols + c];
    partial[chunk * cols + c] = sum;
  }
}

}  // namespace

void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t cols,
              cudaStream_t stream) {
  check_shape("add_bias", rows, cols);
  if (rows == 0 || cols == 0) return;
  const auto count = static_cast<std::size_t>(rows * cols);
  add_bias_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(y, bias, count, cols);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

std::size_t bias_grad_workspace_bytes(std::int64_t rows, std::int64_t cols) {
  check_shape("bias_grad", rows, cols);
  return static_cast<std::size_t>(chunk_count(rows) * cols) * sizeof(float);
}

void bias_grad(const float* dy, float* dbias, std::int64_t rows, std::int64_t cols,
               void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  const std::size_t needed = bias_grad_workspace_bytes(rows, cols);
  if (rows == 0 || cols == 0) return;
  if (workspace_bytes < needed) {
    throw Error(ErrorKind::kUsage, "bias_grad (CUDA): the workspace has " +
                                       std::to_string(workspace_bytes) + " bytes, needs " +
                                       std::to_string(needed));
  }
  const std::int64_t chunks = chunk_count(rows);
  auto* partial = static_cast<float*>(workspace);
  const auto column_blocks = static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads);
  const dim3 grid(column_blocks, static_cast<unsigned>(std::min(chunks, kMaxGridY)));
  column_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(dy, rows, cols, partial);
  ZEST_CUDA_CHECK(cudaGetLastError());
  add_chunk_sums<<<column_blocks, kColumnThreads, 0, stream>>>(partial, chunks, cols, dbias);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
