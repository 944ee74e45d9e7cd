#include "kernels/norm_cuda.h"

#include <cub/device/device_reduce.cuh>

#include <string>

#include "base/cuda_check.h"
#include "base/error.h"

namespace zest::cuda {
namespace {

// What each element contributes, and how two contributions combine. One pass over the shard
// computes both: the norm and the overflow check read the same bytes.
struct SquareAndCount {
  __device__ NormResult operator()(float x) const {
    NormResult r;
    r.sum_of_squares = static_cast<double>(x) * static_cast<double>(x);  // exact in double
    r.non_finite = isfinite(x) ? 0 : 1;
    return r;
  }
};

struct Combine {
  __device__ NormResult operator()(const NormResult& a, const NormResult& b) const {
    NormResult r;
    r.sum_of_squares = a.sum_of_squares + b.sum_of_squares;
    r.non_finite = a.non_finite + b.non_finite;
    return r;
  }
};

cudaError_t reduce(void* workspace, std::size_t& workspace_bytes, const float* data,
                   std::size_t count, NormResult* result, cudaStream_t stream) {
  return cub::DeviceReduce::TransformReduce(workspace, workspace_bytes, data, result, count,
                                            Combine{}, SquareAndCount{}, NormResult{}, stream);
}

}  // namespace

std::size_t squared_norm_workspace_bytes(std::size_t count) {
  std::size_t bytes = 0;
  ZEST_CUDA_CHECK(reduce(nullptr, bytes, nullptr, count, nullptr, nullptr));
  return bytes;
}

void squared_norm(const float* data, std::size_t count, NormResult* result, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream) {
  if (count == 0) {
    ZEST_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(NormResult), stream));
    return;
  }
  const std::size_t needed = squared_norm_workspace_bytes(count);
  if (workspace_bytes < needed) {
    throw Error(ErrorKind::kUsage, "squared_norm: the workspace has " +
                                       std::to_string(workspace_bytes) + " bytes, " +
                                       std::to_string(count) + " elements need " +
                                       std::to_string(needed));
  }
  ZEST_CUDA_CHECK(reduce(workspace, workspace_bytes, data, count, result, stream));
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
