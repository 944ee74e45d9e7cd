#include "memory/host_allocator.h"

#include <cstdlib>

namespace zest {

void* HostAllocator::raw_allocate(std::size_t bytes) {
  return std::aligned_alloc(kAllocationAlignment, bytes);
}

void HostAllocator::raw_free(void* data, std::size_t /*bytes*/) { std::free(data); }

}  // namespace zest
