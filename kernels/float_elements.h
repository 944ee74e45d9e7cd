// The CPU kernels' reads and writes of fp32, bf16 and fp16 elements: every element is computed
// in fp32, read with to_float and written back with from_float (round to nearest even).
#pragma once

#include <type_traits>

#include "base/dtype.h"

namespace zest::cpu {

inline float to_float(float value) { return value; }
inline float to_float(BFloat16 value) { return static_cast<float>(value); }
inline float to_float(Float16 value) { return static_cast<float>(value); }

template <typename T>
inline T from_float(float value) {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else {
    return T(value);
  }
}

}  // namespace zest::cpu
