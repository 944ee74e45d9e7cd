#include "kernels/gradient_statistics_cuda.h"

#include <cub/device/device_reduce.cuh>

#include <cstdint>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/element_types_cuda.cuh"

namespace zest::cuda {
namespace {

// Note: the partial result and CUB's storage share the one workspace region a stream gives a
// launch: the result first, padded to 256 bytes so that CUB's storage starts as aligned as the
// region (CUB aligns its own pieces to 256 bytes).
constexpr std::size_t kResultBytes = (sizeof(GradientStatistics) + 255) / 256 * 256;




// What one element contributes: one pass reads each element once for both statistics.
template <typename Type>
struct SquareAndCount {
  __device__ GradientStatistics operator()(typename Type::Storage stored) const {
    const float value = Type::load(stored);
    GradientStatistics r;
    r.sum_of_squares = static_cast<double>(value) * static_cast<double>(value);  // exact
    r.non_finite = isfinite(value) ? 0 : 1;
    return r;
  }
};

struct Combine {
  __device__ GradientStatistics operator()(const GradientStatistics& a,
                                           const GradientStatistics& b) const {
    GradientStatistics r;
    r.sum_of_squares = a.sum_of_squares + b.sum_of_squares;
    r.non_finite = a.non_finite + b.non_finite;
    return r;
  }
};

template <typename Type>
cudaError_t reduce(void* storage, std::size_t& storage_bytes, const void* data,
                   std::size_t count, GradientStatistics* result, cudaStream_t stream) {
  return cub::DeviceReduce::TransformReduce(
      storage, storage_bytes, static_cast<const typename Type::Storage*>(data), result, count,
      Combine{}, SquareAndCount<Type>{}, GradientStatistics{}, stream);
}


// One thread adds the partial result in: a fixed order, where a float atomic's would vary.
__global__ void add_statistics_kernel(const GradientStatistics* __restrict__ partial,
                                      GradientStatistics* __restrict__ statistics) {
  statistics->sum_of_squares += partial->sum_of_squares;
  statistics->non_finite += partial->non_finite;
}

__global__ void add_sum_kernel(const GradientStatistics* __restrict__ partial,
                               double* __restrict__ sum_of_squares) {
  *sum_of_squares += partial->sum_of_squares;
}

// Reduces `count` elements of `type` into the workspace's result and returns the result.
GradientStatistics* reduce_into_result(const char* kernel, const void* data, DType type,
                                     std::size_t count, void* workspace,
                                     std::size_t workspace_bytes, cudaStream_t stream) {
  const std::size_t needed = gradient_statistics_workspace_bytes(type, count);
  if (workspace_bytes < needed) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + " (CUDA): the workspace has " +
                                       std::to_string(workspace_bytes) + " bytes, " +
                                       std::to_string(count) + " elements need " +
                                       std::to_string(needed));
  }
  auto* result = static_cast<GradientStatistics*>(workspace);
  void* storage = static_cast<unsigned char*>(workspace) + kResultBytes;
  std::size_t storage_bytes = workspace_bytes - kResultBytes;
  with_element_type(type, "add_gradient_statistics (CUDA)", [&](auto tag) {
    ZEST_CUDA_CHECK(
        reduce<decltype(tag)>(storage, storage_bytes, data, count, result, stream));
  });
  return result;
}

}  // namespace

std::size_t gradient_statistics_workspace_bytes(DType type, std::size_t count) {
  std::size_t storage_bytes = 0;
  with_element_type(type, "add_gradient_statistics (CUDA)", [&](auto tag) {
    ZEST_CUDA_CHECK(reduce<decltype(tag)>(nullptr, storage_bytes, nullptr, count, nullptr,
                                          nullptr));
  });
  return kResultBytes + storage_bytes;
}

void add_gradient_statistics(const void* data, DType type, std::size_t count,
                             GradientStatistics* statistics, void* workspace,
                             std::size_t workspace_bytes, cudaStream_t stream) {
  with_element_type(type, "add_gradient_statistics (CUDA)", [](auto) {});  // the type is refused before the empty case returns
  if (count == 0) return;
  const GradientStatistics* partial = reduce_into_result(
      "add_gradient_statistics", data, type, count, workspace, workspace_bytes, stream);
  add_statistics_kernel<<<1, 1, 0, stream>>>(partial, statistics);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void add_sum_of_squares(const float* data, std::size_t count, double* sum_of_squares,
                        void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  if (count == 0) return;
  const GradientStatistics* partial = reduce_into_result(
      "add_sum_of_squares", data, DType::kFloat32, count, workspace, workspace_bytes, stream);
  add_sum_kernel<<<1, 1, 0, stream>>>(partial, sum_of_squares);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
