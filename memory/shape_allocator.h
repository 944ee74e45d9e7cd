// The shape-only device's memory (runtime/shape_device.h): an allocator that hands out addresses
// it never backs, with the Allocator's capacity and per-category accounting, so that running
// the engine on it measures what the engine would allocate without holding any of it.
// Invariant: nothing reads or writes through its addresses; they lie outside the address space
// (non-canonical on x86-64), so a stray access faults at once instead of touching real memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "memory/allocator.h"

namespace zest {

class ShapeAllocator final : public Allocator {
 public:
  // `region`: 0 or 1; the two regions' addresses never meet, so a device's and its host's
  // allocators can tell their buffers apart (owns()).
  explicit ShapeAllocator(std::string device_name, std::size_t capacity = kUnlimitedCapacity,
                          int region = 0);

  // Whether `data` was handed out by this allocator.
  bool owns(const void* data) const;

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* data, std::size_t bytes) override;

 private:
  const std::uintptr_t first_;
  std::atomic<std::uintptr_t> next_;  // the next address handed out; addresses are never reused
};

}  // namespace zest
