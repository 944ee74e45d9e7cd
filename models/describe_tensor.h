// A tensor as the models' usage errors name it: "float32 [2, 64]".
#pragma once

#include <string>

#include "memory/tensor.h"

namespace zest {

inline std::string describe_tensor(const Tensor& tensor) {
  return std::string(dtype_name(tensor.dtype)) + " " + shape_to_string(tensor.shape);
}

}  // namespace zest
