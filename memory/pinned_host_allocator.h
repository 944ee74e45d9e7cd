// The CUDA device's host arena: page-locked host memory (cudaHostAlloc), where an offloaded
// optimizer's state and its transfer shards live. Page-locked, because only then is a copy
// between it and the GPU asynchronous: from pageable memory cudaMemcpyAsync makes the host wait,
// which would stall the engine's host thread in the middle of backward. Same capacity and
// category accounting as every Allocator. Invariant: cudaFreeHost is a CUDA call, so a Buffer
// freed inside a CUDA host function (a closure on a CUDA stream) is queued and freed at the next
// allocation from a host thread, or with the allocator; allocating there is an error.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "memory/pinned_host_allocator.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "memory/allocator.h"

namespace zest::cuda {

class PinnedHostAllocator final : public Allocator {
 public:
  explicit PinnedHostAllocator(std::string device_name, std::size_t capacity = kUnlimitedCapacity,
                               std::string advice = "")
      : Allocator(std::move(device_name), capacity, std::move(advice)) {}
  // Frees what was deferred from host functions.
  ~PinnedHostAllocator() override;

  PinnedHostAllocator(const PinnedHostAllocator&) = delete;
  PinnedHostAllocator& operator=(const PinnedHostAllocator&) = delete;

 protected:
  // Null when CUDA cannot page-lock that much (cudaErrorMemoryAllocation): an out-of-memory;
  // other failures throw kDevice.
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* data, std::size_t bytes) override;

 private:
  void release_deferred();

  std::mutex mutex_;
  std::vector<void*> deferred_;  // guarded by mutex_
};

}  // namespace zest::cuda
