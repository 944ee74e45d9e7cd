#include "kernels/cross_entropy_cuda.h"

#include <climits>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/reduce_cuda.cuh"

namespace zest::cuda {
namespace {

constexpr unsigned kRowThreads = 256;     // one block per row of (tens of thousands of) classes
constexpr unsigned kFinishThreads = 1024;  // one block sums the rows' terms

void check_shape(const char* kernel, std::int64_t rows, std::int64_t classes) {
  // Note: one block per row, so rows is a grid dimension (< 2^31).
  if (rows < 1 || rows > INT_MAX || classes < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) +
                                       " (CUDA): needs 1 <= rows < 2^31 and classes >= 1, got [" +
                                       std::to_string(rows) + ", " + std::to_string(classes) + "]");
  }
}

struct RowStats {
  float max;
  double exp_sum;  // sum_j exp(x_j - max), in double as on the CPU
};

// Every thread of the block gets the row's max and exp sum.
__device__ RowStats row_stats(const float* row, std::int64_t classes) {
  float max = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) max = fmaxf(max, row[j]);
  max = block_max(max);
  double sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) sum += expf(row[j] - max);
  return {max, block_sum(sum)};
}

__device__ bool valid(std::int32_t target, std::int64_t classes) {
  return target >= 0 && target < classes;
}

// terms[r] = log(sum exp(x - max)) - (x[target] - max) = -log softmax[target].
__global__ void row_loss_kernel(const float* __restrict__ logits,
                                const std::int32_t* __restrict__ targets, std::int64_t classes,
                                double* __restrict__ terms) {
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * classes;
  const RowStats stats = row_stats(row, classes);
  if (threadIdx.x != 0) return;
  const std::int32_t target = targets[r];
  terms[r] = valid(target, classes)
                 ? log(stats.exp_sum) - static_cast<double>(row[target] - stats.max)
                 : nan("");
}

// *loss = mean of terms: each thread sums a fixed stride of rows, then a fixed tree.
__global__ void mean_kernel(const double* __restrict__ terms, std::int64_t rows,
                            float* __restrict__ loss) {
  double sum = 0.0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += terms[r];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *loss = static_cast<float>(sum / static_cast<double>(rows));
}

// Note: no __restrict__: dlogits may be logits. Each element is read, then written by the same
// thread, after the row's statistics are complete (block_sum synchronizes).
__global__ void backward_kernel(const float* logits, const std::int32_t* __restrict__ targets,
                                std::int64_t classes, float row_scale, float* dlogits) {
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * classes;
  float* drow = dlogits + r * classes;
  const RowStats stats = row_stats(row, classes);
  const std::int32_t target = targets[r];
  const float inv_sum = valid(target, classes) ? static_cast<float>(1.0 / stats.exp_sum) : NAN;
  for (std::int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
    // The CPU's roundings: exp * inv_sum * row_scale, then minus row_scale at the target.
    float g = __fmul_rn(__fmul_rn(expf(row[j] - stats.max), inv_sum), row_scale);
    if (j == target) g = __fsub_rn(g, row_scale);
    drow[j] = g;
  }
}

}  // namespace

std::size_t cross_entropy_forward_workspace_bytes(std::int64_t rows) {
  check_shape("cross_entropy_forward", rows, 1);
  return static_cast<std::size_t>(rows) * sizeof(double);
}

void cross_entropy_forward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t classes, float* loss, void* workspace,
                           std::size_t workspace_bytes, cudaStream_t stream) {
  check_shape("cross_entropy_forward", rows, classes);
  const std::size_t needed = cross_entropy_forward_workspace_bytes(rows);
  if (workspace_bytes < needed) {
    throw Error(ErrorKind::kUsage, "cross_entropy_forward (CUDA): the workspace has " +
                                       std::to_string(workspace_bytes) + " bytes, needs " +
                                       std::to_string(needed));
  }
  double* terms = static_cast<double*>(workspace);
  row_loss_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, targets,
                                                                          classes, terms);
  ZEST_CUDA_CHECK(cudaGetLastError());
  mean_kernel<<<1, kFinishThreads, 0, stream>>>(terms, rows, loss);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_backward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                            std::int64_t classes, float scale, float* dlogits,
                            cudaStream_t stream) {
  check_shape("cross_entropy_backward", rows, classes);
  const float row_scale = scale / static_cast<float>(rows);  // as the CPU body, on the host
  backward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, targets,
                                                                          classes, row_scale,
                                                                          dlogits);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
