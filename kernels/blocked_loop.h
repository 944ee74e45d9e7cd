// Runs an elementwise loop body over [0, count) in fixed-size blocks plus one tail. At -O2 GCC
// vectorizes only loops whose trip count it knows divides by the vector width ("very cheap"
// cost model); a body inlined with n == kVectorBlock is such a loop. Invariant: body(offset, n)
// must touch elements [offset, offset + n) only, so blocks are independent.
#pragma once

#include <cstddef>

namespace zest {

inline constexpr std::size_t kVectorBlock = 64;  // elements; a multiple of any SIMD width

template <typename Body>
inline void for_each_block(std::size_t count, Body&& body) {
  std::size_t offset = 0;
  for (; offset + kVectorBlock <= count; offset += kVectorBlock) body(offset, kVectorBlock);
  if (offset < count) body(offset, count - offset);
}

}  // namespace zest
