#include "memory/shape_allocator.h"

#include <utility>

namespace zest {
namespace {
// Note: the first address of the non-canonical hole of x86-64's 48-bit (and 57-bit) address
// space, so any access through a handed-out address faults. Each region has 2^61 bytes of
// addresses, far beyond any plan.
constexpr std::uintptr_t kFirstAddress = std::uintptr_t{1} << 62;
constexpr std::uintptr_t kRegionBytes = std::uintptr_t{1} << 61;
}  // namespace

ShapeAllocator::ShapeAllocator(std::string device_name, std::size_t capacity, int region)
    : Allocator(std::move(device_name), capacity),
      first_(kFirstAddress + static_cast<std::uintptr_t>(region) * kRegionBytes),
      next_(first_) {}

bool ShapeAllocator::owns(const void* data) const {
  const auto address = reinterpret_cast<std::uintptr_t>(data);
  return address >= first_ && address < next_.load();
}

void* ShapeAllocator::raw_allocate(std::size_t bytes) {
  // `bytes` is a multiple of the alignment, so every address handed out stays aligned.
  return reinterpret_cast<void*>(next_.fetch_add(bytes));
}

void ShapeAllocator::raw_free(void* data, std::size_t bytes) {
  (void)data;
  (void)bytes;
}

}  // namespace zest
