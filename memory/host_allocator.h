// The CPU device's memory: aligned host allocations behind the Allocator's capacity and
// accounting, so that a "device" of 2 GiB can be emulated on a large host and its
// out-of-memory is as real as a GPU's. The CPU device's host arena (where an offloaded
// optimizer lives) is a second one, with its own capacity.
#pragma once

#include <string>
#include <utility>

#include "memory/allocator.h"

namespace zest {

class HostAllocator final : public Allocator {
 public:
  // The first one made sets glibc to keep freed memory for the process (host_allocator.cc).
  explicit HostAllocator(std::string device_name, std::size_t capacity = kUnlimitedCapacity,
                         std::string advice = "");

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* data, std::size_t bytes) override;
};

}  // namespace zest
