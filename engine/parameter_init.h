// Initial parameter values drawn from a counter-based generator: the value of an element
// depends only on (seed, unit, parameter, element index). So the initial model is the same at
// any world size and stage, and a rank that holds only its shard draws only the shard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/module.h"

namespace zest {

// Writes `count` values of parameter `param` of unit `unit`, starting at its element `first`.
void fill_initial_values(const Initializer& init, std::uint64_t seed, int unit, std::size_t param,
                         std::size_t first, std::size_t count, float* out);

// The same for a tensor-parallel slice of shape `shape` (ParamSpec::DrawSlice): its elements
// [first, first + count) take the values of the whole parameter's elements they were cut from.
void fill_slice_initial_values(const Initializer& init, const ParamSpec::DrawSlice& slice,
                               const std::vector<std::int64_t>& shape, std::uint64_t seed,
                               int unit, std::size_t param, std::size_t first, std::size_t count,
                               float* out);

}  // namespace zest
