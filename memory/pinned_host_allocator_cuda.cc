#include "memory/pinned_host_allocator.h"

#include <cuda_runtime.h>

#include "base/cuda_check.h"
#include "memory/cuda_pool_allocator.h"

namespace zest::cuda {

PinnedHostAllocator::~PinnedHostAllocator() { release_deferred(); }

void PinnedHostAllocator::release_deferred() {
  if (CudaHostFunctionScope::active()) return;
  std::vector<void*> frees;
  {
    std::lock_guard lock(mutex_);
    frees.swap(deferred_);
  }
  for (void* data : frees) (void)cudaFreeHost(data);
}

void* PinnedHostAllocator::raw_allocate(std::size_t bytes) {
  CudaHostFunctionScope::refuse_allocation_if_active(device_name());
  release_deferred();
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
  if (CudaHostFunctionScope::active()) {
    // Note: a host function runs after its stream's earlier work, so the memory's last use on
    // that stream is done; a free from a host thread later cannot overtake it.
    std::lock_guard lock(mutex_);
    deferred_.push_back(data);
    return;
  }
  (void)cudaFreeHost(data);  // must not throw; a failure here leaves the memory to the process
}

}  // namespace zest::cuda
