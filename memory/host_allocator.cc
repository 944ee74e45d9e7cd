#include "memory/host_allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <mutex>

namespace zest {
namespace {

// Note: a training step frees and allocates the same activation and workspace sizes every
// step. glibc gives the top of its heaps back to the kernel past M_TRIM_THRESHOLD (128 KiB by
// default, raised only by its own heuristics), so each step faulted its activations in again:
// about a sixth of a one-rank CPU step went to page faults. Freed memory is kept instead, and
// blocks up to 32 MiB (glibc's largest automatic threshold) come from the heaps rather than
// fresh mappings, so memory is touched once. A MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_
// in the environment is the user's choice and is kept.
void keep_freed_memory() {
  constexpr int kNeverTrim = 1 << 30;       // bytes at the heap's top before giving them back
  constexpr int kHeapBlocks = 32 << 20;     // larger blocks are mapped on their own
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, kNeverTrim);
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, kHeapBlocks);
}

}  // namespace

HostAllocator::HostAllocator(std::string device_name, std::size_t capacity, std::string advice)
    : Allocator(std::move(device_name), capacity, std::move(advice)) {
  static std::once_flag once;
  std::call_once(once, keep_freed_memory);
}

void* HostAllocator::raw_allocate(std::size_t bytes) {
  return std::aligned_alloc(kAllocationAlignment, bytes);
}

void HostAllocator::raw_free(void* data, std::size_t /*bytes*/) { std::free(data); }

}  // namespace zest
