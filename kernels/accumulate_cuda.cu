#include "kernels/accumulate_cuda.h"

#include <cstdint>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/launch_cuda.cuh"
#include "kernels/element_types_cuda.cuh"

namespace zest::cuda {
namespace {




// Four elements, loaded and stored as one 16-byte (fp32) or 8-byte (2-byte types) access.
template <typename T>
struct alignas(4 * sizeof(T)) Four {
  T value[4];
};

template <typename D, typename S>
__device__ __forceinline__ typename D::Storage add(typename D::Storage to,
                                                   typename S::Storage from) {
  return D::store(__fadd_rn(D::load(to), S::load(from)));
}

// `groups` runs of four first (0 unless both arrays are aligned to their Four), then the rest one
// by one.
template <typename D, typename S>
__global__ void accumulate_into_kernel(typename D::Storage* __restrict__ destination,
                                       const typename S::Storage* __restrict__ source,
                                       std::size_t count, std::size_t groups) {
  using DFour = Four<typename D::Storage>;
  using SFour = Four<typename S::Storage>;
  for (std::size_t group = first_index(); group < groups; group += grid_stride()) {
    DFour to = reinterpret_cast<DFour*>(destination)[group];
    const SFour from = reinterpret_cast<const SFour*>(source)[group];
    for (int k = 0; k < 4; ++k) to.value[k] = add<D, S>(to.value[k], from.value[k]);
    reinterpret_cast<DFour*>(destination)[group] = to;
  }
  for (std::size_t i = groups * 4 + first_index(); i < count; i += grid_stride()) {
    destination[i] = add<D, S>(destination[i], source[i]);
  }
}

template <typename D, typename S>
void launch(void* destination, const void* source, std::size_t count, cudaStream_t stream) {
  auto* to = static_cast<typename D::Storage*>(destination);
  const auto* from = static_cast<const typename S::Storage*>(source);
  const std::size_t groups =
      vector_groups(count, aligned_to(to, sizeof(Four<typename D::Storage>)) &&
                               aligned_to(from, sizeof(Four<typename S::Storage>)));
  accumulate_into_kernel<D, S>
      <<<block_count(groups + (count - groups * 4)), kThreadsPerBlock, 0, stream>>>(
          to, from, count, groups);
  ZEST_CUDA_CHECK(cudaGetLastError());
}


}  // namespace

void accumulate_into(void* destination, DType destination_type, const void* source,
                     DType source_type, std::size_t count, cudaStream_t stream) {
  with_element_type(destination_type, "accumulate_into (CUDA)", [&](auto destination_tag) {
    with_element_type(source_type, "accumulate_into (CUDA)", [&](auto source_tag) {
      if (count == 0) return;
      launch<decltype(destination_tag), decltype(source_tag)>(destination, source, count, stream);
    });
  });
}

}  // namespace zest::cuda
