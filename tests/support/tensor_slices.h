// Tensor-parallel slices put back together in tests: where element k of a rank's slice sits in the
// whole parameter, by the rule ParamSpec::DrawSlice draws it with (engine/parameter_init.cc), and
// a whole parameter assembled from the group's slices. Written from engine/module.h's description
// of DrawSlice, not from the checkpoint's reading of it, so the tests of that reading
// (checkpoint/tensor_split.h) compare two accounts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/module.h"

namespace zest::testing {

// The whole element DrawSlice puts element `element` of a slice at; the element itself for a
// parameter that is not cut.
inline std::size_t drawn_at(const ParamSpec& spec, std::size_t element) {
  const ParamSpec::DrawSlice& s = spec.draw_slice;
  if (!s.enabled()) return element;
  const auto columns = static_cast<std::size_t>(spec.shape.size() >= 2 ? spec.shape.back() : 1);
  const std::size_t row = element / columns;
  const auto block = static_cast<std::size_t>(s.row_block);
  const std::size_t whole_row = (row / block) * static_cast<std::size_t>(s.row_stride) +
                                static_cast<std::size_t>(s.row_first) + row % block;
  return whole_row * static_cast<std::size_t>(s.full_columns) +
         static_cast<std::size_t>(s.column_first) + element % columns;
}

// A whole parameter filled in slice by slice. A replicated parameter is placed by every rank of
// the group: largest_gap is the largest difference between two copies of one element.
struct WholeParameter {
  std::vector<float> values;
  std::vector<bool> placed;
  float largest_gap = 0.0f;

  explicit WholeParameter(std::size_t size = 0) : values(size), placed(size) {}

  void place(const ParamSpec& spec, const std::vector<float>& slice) {
    for (std::size_t k = 0; k < slice.size(); ++k) {
      const std::size_t at = drawn_at(spec, k);
      if (placed.at(at)) largest_gap = std::max(largest_gap, std::abs(values[at] - slice[k]));
      values[at] = slice[k];
      placed[at] = true;
    }
  }
  bool complete() const {
    return std::all_of(placed.begin(), placed.end(), [](bool p) { return p; });
  }
};

}  // namespace zest::testing
