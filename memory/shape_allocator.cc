#include "memory/shape_allocator.h"

#include <utility>

namespace zest {
namespace {
// Note: the first address of the non-canonical hole of x86-64's 48-bit (and 57-bit) address
// space, so any access through a handed-out address faults. 2^62 bytes of addresses are handed
// out before it would wrap, far beyond any plan.
constexpr std::uintptr_t kFirstAddress = std::uintptr_t{1} << 62;
}  // namespace

ShapeAllocator::ShapeAllocator(std::string device_name, std::size_t capacity)
    : Allocator(std::move(device_name), capacity), next_(kFirstAddress) {}

void* ShapeAllocator::raw_allocate(std::size_t bytes) {
  // `bytes` is a multiple of the alignment, so every address handed out stays aligned.
  return reinterpret_cast<void*>(next_.fetch_add(bytes));
}

void ShapeAllocator::raw_free(void* data, std::size_t bytes) {
  (void)data;
  (void)bytes;
}

}  // namespace zest
