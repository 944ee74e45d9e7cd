#include "memory/pinned_host_allocator.h"

#include <cuda_runtime.h>

#include "base/cuda_check.h"

namespace zest::cuda {

void* PinnedHostAllocator::raw_allocate(std::size_t bytes) {
  void* data = nullptr;
  // Portable: any GPU of the process may copy from it (a rank's device is the current one,
  // but the flag costs nothing and keeps the memory usable whichever device is current).
  const cudaError_t status = cudaHostAlloc(&data, bytes, cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  check(status, "cudaHostAlloc(&data, bytes, cudaHostAllocPortable)", __FILE__, __LINE__);
  return data;
}

void PinnedHostAllocator::raw_free(void* data, std::size_t /*bytes*/) {
  (void)cudaFreeHost(data);  // must not throw; a failure here leaves the memory to the process
}

}  // namespace zest::cuda
