#include "kernels/scale_cuda.h"

#include "base/cuda_check.h"
#include "kernels/launch_cuda.cuh"

namespace zest::cuda {
namespace {

__global__ void scale_kernel(float* __restrict__ data, std::size_t count, std::size_t groups,
                             float factor) {
  for (std::size_t group = first_index(); group < groups; group += grid_stride()) {
    float4 x = reinterpret_cast<float4*>(data)[group];
    x.x *= factor;
    x.y *= factor;
    x.z *= factor;
    x.w *= factor;
    reinterpret_cast<float4*>(data)[group] = x;
  }
  for (std::size_t i = groups * 4 + first_index(); i < count; i += grid_stride()) {
    data[i] *= factor;
  }
}

}  // namespace

void scale(float* data, std::size_t count, float factor, cudaStream_t stream) {
  if (count == 0) return;
  const std::size_t groups = vector_groups(count, aligned_to(data, 16));
  scale_kernel<<<block_count(groups + (count - groups * 4)), kThreadsPerBlock, 0, stream>>>(
      data, count, groups, factor);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
