#include "kernels/vocab_parallel_cross_entropy_cuda.h"

#include <climits>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/reduce_cuda.cuh"

namespace zest::cuda {
namespace {

constexpr unsigned kRowThreads = 256;      // one block per row of a rank's columns (V/t of them)
constexpr unsigned kFinishThreads = 1024;  // one block sums the rows' terms

void check_rows(const char* kernel, std::int64_t rows) {
  if (rows < 1 || rows > INT_MAX) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + " (CUDA): needs 1 <= rows < 2^31, got " +
                                       std::to_string(rows));
  }
}

__global__ void row_max_kernel(const float* __restrict__ logits, std::int64_t cols,
                               float* __restrict__ max_out) {
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * cols;
  float max = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) max = fmaxf(max, row[c]);
  max = block_max(max);
  if (threadIdx.x == 0) max_out[r] = max;
}

__global__ void partials_kernel(const float* __restrict__ logits,
                                const std::int32_t* __restrict__ targets, std::int64_t rows,
                                std::int64_t cols, std::int64_t begin, std::int64_t classes,
                                const float* __restrict__ gathered_max, int group,
                                float* __restrict__ max_out, float* __restrict__ partial) {
  const std::int64_t r = blockIdx.x;
  // Every thread takes the group's largest in the same order, so all agree without a broadcast.
  float max = gathered_max[r];
  for (int g = 1; g < group; ++g) max = fmaxf(max, gathered_max[g * rows + r]);
  const float* row = logits + r * cols;
  double sum = 0.0;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    sum += exp(static_cast<double>(row[c] - max));
  }
  sum = block_sum(sum);
  if (threadIdx.x != 0) return;
  max_out[r] = max;
  partial[r] = static_cast<float>(sum);
  const std::int32_t target = targets[r];
  const std::int64_t local = static_cast<std::int64_t>(target) - begin;
  float target_logit = local >= 0 && local < cols ? row[local] : 0.0f;
  if (target < 0 || target >= classes) target_logit = nanf("");  // every rank: the sum is NaN
  partial[rows + r] = target_logit;
}

// lse[r] and the mean of lse - target logit: each thread sums a fixed stride of rows, then a
// fixed tree.
__global__ void finish_kernel(const float* __restrict__ max,
                              const float* __restrict__ summed_partial, std::int64_t rows,
                              float* __restrict__ lse, float* __restrict__ loss) {
  double total = 0.0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    // As the CPU body: lse rounded to float first, the target logit subtracted in double.
    const float row_lse = max[r] + logf(summed_partial[r]);
    lse[r] = row_lse;
    total += static_cast<double>(row_lse) - static_cast<double>(summed_partial[rows + r]);
  }
  total = block_sum(total);
  if (threadIdx.x == 0) *loss = static_cast<float>(total / static_cast<double>(rows));
}

// Note: no __restrict__ on logits and dlogits: they may be the same buffer. Each element is read,
// then written by the same thread.
__global__ void backward_kernel(const float* logits, const std::int32_t* __restrict__ targets,
                                std::int64_t cols, std::int64_t begin,
                                const float* __restrict__ lse, float factor, float* dlogits) {
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * cols;
  float* out = dlogits + r * cols;
  const float row_lse = lse[r];
  const std::int64_t local = static_cast<std::int64_t>(targets[r]) - begin;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    // The CPU's roundings: (exp(x - lse) - onehot) first, then times the factor.
    const float probability = expf(row[c] - row_lse);
    out[c] = __fmul_rn(c == local ? __fsub_rn(probability, 1.0f) : probability, factor);
  }
}

}  // namespace

void vocab_parallel_row_max(const float* logits, std::int64_t rows, std::int64_t cols,
                            float* max_out, cudaStream_t stream) {
  check_rows("vocab_parallel_row_max", rows);
  row_max_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(logits, cols, max_out);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void vocab_parallel_partials(const float* logits, const std::int32_t* targets, std::int64_t rows,
                             std::int64_t cols, std::int64_t begin, std::int64_t classes,
                             const float* gathered_max, int group, float* max_out, float* partial,
                             cudaStream_t stream) {
  check_rows("vocab_parallel_partials", rows);
  partials_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      logits, targets, rows, cols, begin, classes, gathered_max, group, max_out, partial);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void vocab_parallel_finish(const float* max, const float* summed_partial, std::int64_t rows,
                           float* lse, float* loss, cudaStream_t stream) {
  check_rows("vocab_parallel_finish", rows);
  finish_kernel<<<1, kFinishThreads, 0, stream>>>(max, summed_partial, rows, lse, loss);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void vocab_parallel_cross_entropy_backward(const float* logits, const std::int32_t* targets,
                                           std::int64_t rows, std::int64_t cols, std::int64_t begin,
                                           const float* lse, float scale, float* dlogits,
                                           cudaStream_t stream) {
  check_rows("vocab_parallel_cross_entropy_backward", rows);
  const float factor = scale / static_cast<float>(rows);  // as the CPU body, on the host
  backward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      logits, targets, cols, begin, lse, factor, dlogits);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
