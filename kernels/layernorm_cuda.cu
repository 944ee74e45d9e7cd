#include "kernels/layernorm_cuda.h"

#include <algorithm>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/reduce_cuda.cuh"

namespace zest::cuda {
namespace {

constexpr unsigned kRowsPerBlock = 8;  // one warp per row, 256 threads
constexpr unsigned kColumnThreads = 256;
constexpr std::int64_t kMaxGridY = 65535;  // CUDA's limit; more chunks loop

void check_shape(const char* kernel, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) +
                                       " (CUDA): needs rows >= 0 and cols >= 1, got [" +
                                       std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// One warp per row. Note: the row's sums are in double, in two passes, as the CPU body's: a row
// far from zero mean keeps its variance, and GPU and CPU statistics agree to double rounding.
__global__ void forward_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                               const float* __restrict__ bias, std::int64_t rows,
                               std::int64_t cols, float eps, float* __restrict__ y,
                               float* __restrict__ mean, float* __restrict__ rstd) {
  const std::int64_t r = warp_row(kRowsPerBlock);
  if (r >= rows) return;
  const unsigned lane = threadIdx.x % kWarpSize;
  const float* row = x + r * cols;
  double sum = 0.0;
  for (std::int64_t j = lane; j < cols; j += kWarpSize) sum += row[j];
  const double m = warp_sum(sum) / static_cast<double>(cols);
  double square_sum = 0.0;
  for (std::int64_t j = lane; j < cols; j += kWarpSize) {
    const double centered = row[j] - m;
    square_sum += centered * centered;
  }
  const double s = 1.0 / sqrt(warp_sum(square_sum) / static_cast<double>(cols) + eps);
  float* out = y + r * cols;
  for (std::int64_t j = lane; j < cols; j += kWarpSize) {
    // The CPU's roundings: the normalized value to float, times weight, plus bias, no FMA.
    out[j] = __fadd_rn(__fmul_rn(static_cast<float>((row[j] - m) * s), weight[j]), bias[j]);
  }
  if (lane == 0) {
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(s);
  }
}

// dx += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dy * weight; one warp
// per row, fp32 as on the CPU.
__global__ void dx_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                          const float* __restrict__ weight, const float* __restrict__ mean,
                          const float* __restrict__ rstd, std::int64_t rows, std::int64_t cols,
                          float* __restrict__ dx) {
  const std::int64_t r = warp_row(kRowsPerBlock);
  if (r >= rows) return;
  const unsigned lane = threadIdx.x % kWarpSize;
  const float* drow = dy + r * cols;
  const float* row = x + r * cols;
  const float m = mean[r];
  const float s = rstd[r];
  float dnorm_sum = 0.0f;
  float dnorm_xhat_sum = 0.0f;
  for (std::int64_t j = lane; j < cols; j += kWarpSize) {
    const float xhat = (row[j] - m) * s;
    const float dnorm = drow[j] * weight[j];
    dnorm_sum += dnorm;
    dnorm_xhat_sum += dnorm * xhat;
  }
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const float dnorm_mean = warp_sum(dnorm_sum) * inv_cols;
  const float dnorm_xhat_mean = warp_sum(dnorm_xhat_sum) * inv_cols;
  float* dxrow = dx + r * cols;
  for (std::int64_t j = lane; j < cols; j += kWarpSize) {
    const float xhat = (row[j] - m) * s;
    const float dnorm = drow[j] * weight[j];
    dxrow[j] += s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
  }
}

// Per chunk of kRowsPerChunk rows, in row order: partial_w = sum xhat * dy, partial_b = sum dy.
// One thread per column: a warp reads consecutive columns of a row (coalesced).
__global__ void column_partials_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                       const float* __restrict__ mean,
                                       const float* __restrict__ rstd, std::int64_t rows,
                                       std::int64_t cols, float* __restrict__ partial_w,
                                       float* __restrict__ partial_b) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const std::int64_t chunks = chunk_count(rows);
  for (std::int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const std::int64_t end = min(rows, (chunk + 1) * kRowsPerChunk);
    float w = 0.0f;
    float b = 0.0f;
    for (std::int64_t r = chunk * kRowsPerChunk; r < end; ++r) {
      const float d = dy[r * cols + c];
      w += (x[r * cols + c] - mean[r]) * rstd[r] * d;
      b += d;
    }
    partial_w[chunk * cols + c] = w;
    partial_b[chunk * cols + c] = b;
  }
}

}  // namespace

void layernorm_forward(const float* x, const float* weight, const float* bias, std::int64_t rows,
                       std::int64_t cols, float eps, float* y, float* mean, float* rstd,
                       cudaStream_t stream) {
  check_shape("layernorm_forward", rows, cols);
  if (rows == 0) return;
  forward_kernel<<<row_blocks(rows), kRowsPerBlock * kWarpSize, 0, stream>>>(
      x, weight, bias, rows, cols, eps, y, mean, rstd);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

std::size_t layernorm_backward_workspace_bytes(std::int64_t rows, std::int64_t cols) {
  check_shape("layernorm_backward", rows, cols);
  return 2 * static_cast<std::size_t>(chunk_count(rows) * cols) * sizeof(float);
}

void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, std::int64_t rows, std::int64_t cols, float* dx,
                        float* dweight, float* dbias, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream) {
  const std::size_t needed = layernorm_backward_workspace_bytes(rows, cols);
  if (rows == 0) return;
  if (workspace_bytes < needed) {
    throw Error(ErrorKind::kUsage, "layernorm_backward (CUDA): the workspace has " +
                                       std::to_string(workspace_bytes) + " bytes, needs " +
                                       std::to_string(needed));
  }
  dx_kernel<<<row_blocks(rows), kRowsPerBlock * kWarpSize, 0, stream>>>(dy, x, weight, mean, rstd,
                                                                        rows, cols, dx);
  ZEST_CUDA_CHECK(cudaGetLastError());
  const std::int64_t chunks = chunk_count(rows);
  float* partial_w = static_cast<float*>(workspace);
  float* partial_b = partial_w + chunks * cols;
  const auto column_blocks = static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads);
  const dim3 grid(column_blocks, static_cast<unsigned>(std::min<std::int64_t>(chunks, kMaxGridY)));
  column_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(dy, x, mean, rstd, rows, cols,
                                                              partial_w, partial_b);
  ZEST_CUDA_CHECK(cudaGetLastError());
  add_chunk_sums<<<column_blocks, kColumnThreads, 0, stream>>>(partial_w, chunks, cols, dweight);
  add_chunk_sums<<<column_blocks, kColumnThreads, 0, stream>>>(partial_b, chunks, cols, dbias);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
