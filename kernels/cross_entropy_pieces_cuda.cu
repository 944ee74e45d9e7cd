#include "kernels/cross_entropy_pieces_cuda.h"

#include <climits>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/reduce_cuda.cuh"

namespace zest::cuda {
namespace {

constexpr unsigned kRowThreads = 256;      // one block per row of a piece (thousands of classes)
constexpr unsigned kFinishThreads = 1024;  // one block sums the rows' terms

void check_rows(const char* kernel, std::int64_t rows) {
  if (rows < 1 || rows > INT_MAX) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + " (CUDA): needs 1 <= rows < 2^31, got " +
                                       std::to_string(rows));
  }
}

// The running state's arrays, as kernels/cross_entropy_pieces.cc lays them out.
struct Running {
  double* sum;
  float* max;
  float* target_logit;
};
__host__ __device__ inline Running running_of(void* running, std::int64_t rows) {
  double* sum = static_cast<double*>(running);
  float* max = reinterpret_cast<float*>(sum + rows);
  return {sum, max, max + rows};
}

__global__ void piece_forward_kernel(const float* __restrict__ piece, std::int64_t ld,
                                     const std::int32_t* __restrict__ targets, std::int64_t rows,
                                     std::int64_t begin, std::int64_t cols, std::int64_t classes,
                                     void* running) {
  const std::int64_t r = blockIdx.x;
  const Running state = running_of(running, rows);
  const float* row = piece + r * ld;
  float piece_max = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    piece_max = fmaxf(piece_max, row[j]);
  }
  piece_max = block_max(piece_max);
  const float old_max = begin == 0 ? -INFINITY : state.max[r];
  const double old_sum = begin == 0 ? 0.0 : state.sum[r];
  const float max = fmaxf(old_max, piece_max);
  double sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(row[j] - max);
  sum = block_sum(sum);
  if (threadIdx.x != 0) return;
  const double rescale = old_max == max ? 1.0 : exp(static_cast<double>(old_max) - max);
  state.sum[r] = old_sum * rescale + sum;
  state.max[r] = max;
  const std::int32_t target = targets[r];
  if (begin == 0) state.target_logit[r] = nanf("");  // stays NaN for a target outside [0, classes)
  if (target >= 0 && target < classes && target >= begin && target < begin + cols) {
    state.target_logit[r] = row[target - begin];
  }
}

// lse[r] and the mean of lse - target logit: each thread sums a fixed stride of rows, then a
// fixed tree.
__global__ void finish_kernel(const void* running, std::int64_t rows, float* __restrict__ lse,
                              float* __restrict__ loss) {
  const Running state = running_of(const_cast<void*>(running), rows);
  double total = 0.0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const double row_lse = static_cast<double>(state.max[r]) + log(state.sum[r]);
    total += row_lse - static_cast<double>(state.target_logit[r]);
    lse[r] = static_cast<float>(row_lse);
  }
  total = block_sum(total);
  if (threadIdx.x == 0) *loss = static_cast<float>(total / static_cast<double>(rows));
}

// Note: no __restrict__ on piece and dpiece: they may be the same buffer. Each element is read,
// then written by the same thread.
__global__ void piece_backward_kernel(const float* piece, std::int64_t ld,
                                      const std::int32_t* __restrict__ targets,
                                      std::int64_t begin, std::int64_t cols,
                                      const float* __restrict__ lse, float row_scale,
                                      float* dpiece, std::int64_t ldd) {
  const std::int64_t r = blockIdx.x;
  const float* row = piece + r * ld;
  float* drow = dpiece + r * ldd;
  const float row_lse = lse[r];
  const std::int64_t target = static_cast<std::int64_t>(targets[r]) - begin;
  for (std::int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    // The CPU's roundings: exp * 1 * row_scale, then minus row_scale at the target.
    float g = __fmul_rn(expf(row[j] - row_lse), row_scale);
    if (j == target) g = __fsub_rn(g, row_scale);
    drow[j] = g;
  }
}

}  // namespace

void cross_entropy_piece_forward(const float* piece, std::int64_t ld, const std::int32_t* targets,
                                 std::int64_t rows, std::int64_t begin, std::int64_t cols,
                                 std::int64_t classes, void* running, cudaStream_t stream) {
  check_rows("cross_entropy_piece_forward", rows);
  piece_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      piece, ld, targets, rows, begin, cols, classes, running);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_pieces_finish(const void* running, std::int64_t rows, float* lse, float* loss,
                                 cudaStream_t stream) {
  check_rows("cross_entropy_pieces_finish", rows);
  finish_kernel<<<1, kFinishThreads, 0, stream>>>(running, rows, lse, loss);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_piece_backward(const float* piece, std::int64_t ld,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t begin, std::int64_t cols, const float* lse,
                                  float scale, float* dpiece, std::int64_t ldd,
                                  cudaStream_t stream) {
  check_rows("cross_entropy_piece_backward", rows);
  const float row_scale = scale / static_cast<float>(rows);  // as the CPU body, on the host
  piece_backward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      piece, ld, targets, begin, cols, lse, row_scale, dpiece, ldd);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
