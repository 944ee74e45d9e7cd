// The CUDA device's host arena: page-locked host memory (cudaHostAlloc), where an offloaded
// optimizer's state and its transfer shards live. Page-locked, because only then is a copy
// between it and the GPU asynchronous: from pageable memory cudaMemcpyAsync makes the host wait,
// which would stall the engine's host thread in the middle of backward. Same capacity and
// category accounting as every Allocator. Invariant: never freed inside a CUDA host function
// (cudaFreeHost is a CUDA call); the engine frees host-arena buffers on its host stream.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "memory/pinned_host_allocator.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <string>
#include <utility>

#include "memory/allocator.h"

namespace zest::cuda {

class PinnedHostAllocator final : public Allocator {
 public:
  explicit PinnedHostAllocator(std::string device_name, std::size_t capacity = kUnlimitedCapacity,
                               std::string advice = "")
      : Allocator(std::move(device_name), capacity, std::move(advice)) {}

 protected:
  // Null when CUDA cannot page-lock that much (cudaErrorMemoryAllocation): an out-of-memory;
  // other failures throw kDevice.
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* data, std::size_t bytes) override;
};

}  // namespace zest::cuda
