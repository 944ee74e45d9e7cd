// A pairwise covering set: rows of choices, one level per factor, such that every pair of levels
// of any two factors appears together in at least one row. Testing every combination of a dozen
// switches is tens of thousands of runs; most faults that come of features meeting need only
// two of them, and a pairwise set of the same switches is a few dozen rows.
// Invariant: deterministic (the same factors give the same rows, in the same order), so that a
// failing row has a stable name.
#pragma once

#include <cstddef>
#include <set>
#include <tuple>
#include <vector>

namespace zest::testing {

// `levels[f]` is the number of levels of factor f; each row holds a level index per factor.
inline std::vector<std::vector<std::size_t>> pairwise_cover(const std::vector<std::size_t>& levels) {
  using Pair = std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>;  // f, a, g, b
  std::set<Pair> uncovered;
  for (std::size_t f = 0; f < levels.size(); ++f) {
    for (std::size_t g = f + 1; g < levels.size(); ++g) {
      for (std::size_t a = 0; a < levels[f]; ++a) {
        for (std::size_t b = 0; b < levels[g]; ++b) uncovered.insert({f, a, g, b});
      }
    }
  }
  constexpr std::size_t kUnset = static_cast<std::size_t>(-1);
  std::vector<std::vector<std::size_t>> rows;
  while (!uncovered.empty()) {
    // Greedy: seed the row with the first pair still missing, then give every other factor the
    // level that covers the most missing pairs with the levels already chosen.
    std::vector<std::size_t> row(levels.size(), kUnset);
    const auto [f0, a0, g0, b0] = *uncovered.begin();
    row[f0] = a0;
    row[g0] = b0;
    for (std::size_t f = 0; f < levels.size(); ++f) {
      if (row[f] != kUnset) continue;
      std::size_t best = 0;
      std::size_t best_gain = 0;
      for (std::size_t a = 0; a < levels[f]; ++a) {
        std::size_t gain = 0;
        for (std::size_t g = 0; g < levels.size(); ++g) {
          if (g == f || row[g] == kUnset) continue;
          const Pair pair = g < f ? Pair{g, row[g], f, a} : Pair{f, a, g, row[g]};
          gain += uncovered.count(pair);
        }
        if (gain > best_gain) {
          best = a;
          best_gain = gain;
        }
      }
      row[f] = best;
    }
    for (std::size_t f = 0; f < levels.size(); ++f) {
      for (std::size_t g = f + 1; g < levels.size(); ++g) uncovered.erase({f, row[f], g, row[g]});
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace zest::testing
