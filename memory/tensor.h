// A Tensor is a view: a pointer into memory someone else owns (a flat buffer, an activation
// Buffer), a shape and a dtype. It never owns and never copies; its lifetime is the owner's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace zest {

struct Tensor {
  void* data = nullptr;  // view into memory owned elsewhere
  std::vector<std::int64_t> shape;
  DType dtype = DType::kFloat32;

  std::size_t numel() const {
    std::size_t n = 1;
    for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
  std::size_t bytes() const { return numel() * dtype_size(dtype); }
  std::int64_t dim(std::size_t i) const { return shape.at(i); }
  std::size_t rank() const { return shape.size(); }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

std::string shape_to_string(const std::vector<std::int64_t>& shape);

}  // namespace zest
