#include "engine/parameter_init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace zest {

namespace {

// SplitMix64's finalizer: a good 64-bit mix, so neighbouring counters give unrelated values.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in (0, 1): never 0, so log() below is finite.
double unit_uniform(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

}  // namespace

void fill_initial_values(const Initializer& init, std::uint64_t seed, int unit, std::size_t param,
                         std::size_t first, std::size_t count, float* out) {
  const std::uint64_t stream =
      mix(mix(mix(seed) ^ static_cast<std::uint64_t>(unit)) ^ static_cast<std::uint64_t>(param));
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t element = first + i;
    switch (init.kind) {
      case Initializer::Kind::kZeros: out[i] = 0.0f; break;
      case Initializer::Kind::kOnes: out[i] = 1.0f; break;
      case Initializer::Kind::kUniform: {
        const double u = unit_uniform(mix(stream ^ mix(element)));
        out[i] = static_cast<float>(init.a + (init.b - init.a) * u);
        break;
      }
      case Initializer::Kind::kNormal: {
        // Box-Muller from two independent draws of this element.
        const double u1 = unit_uniform(mix(stream ^ mix(2 * element)));
        const double u2 = unit_uniform(mix(stream ^ mix(2 * element + 1)));
        const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        out[i] = static_cast<float>(init.a * normal);
        break;
      }
    }
  }
}

void fill_slice_initial_values(const Initializer& init, const ParamSpec::DrawSlice& slice,
                               const std::vector<std::int64_t>& shape, std::uint64_t seed,
                               int unit, std::size_t param, std::size_t first, std::size_t count,
                               float* out) {
  const auto columns = static_cast<std::size_t>(shape.size() >= 2 ? shape.back() : 1);
  const auto block = static_cast<std::size_t>(slice.row_block);
  std::size_t done = 0;
  // One run per row of the slice: its columns are consecutive in the whole parameter too.
  while (done < count) {
    const std::size_t element = first + done;
    const std::size_t row = element / columns;
    const std::size_t column = element % columns;
    const std::size_t run = std::min(columns - column, count - done);
    const std::size_t whole_row = (row / block) * static_cast<std::size_t>(slice.row_stride) +
                                  static_cast<std::size_t>(slice.row_first) + row % block;
    const std::size_t whole = whole_row * static_cast<std::size_t>(slice.full_columns) +
                              static_cast<std::size_t>(slice.column_first) + column;
    fill_initial_values(init, seed, unit, param, whole, run, out + done);
    done += run;
  }
}

}  // namespace zest
