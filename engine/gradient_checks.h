// The ZeRO engine's gradient checks: each unit's own gradient is checked for inf / NaN before its
// reduction mixes the ranks' gradients, so that a divergence is traced to the rank and unit where
// it arose; and the local norm of the reduced gradients this rank updates is summed for the
// step's global norm. Owns one device buffer of units + 1 GradientStatistics (result u: unit u
// before reduction; the last result: the local norm), read back once per step (one copy, not one
// per unit). Invariant: the results accumulate from reset() to inspect(); every reduction of the
// step is checked in compute-stream order before the comm stream reduces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/divergence_report.h"
#include "engine/flat_unit.h"
#include "engine/stage_plan.h"
#include "kernels/gradient_statistics.h"
#include "memory/allocator.h"
#include "runtime/world.h"

namespace zest {

class GradientChecks {
 public:
  // Allocates and zeroes the results (category workspace).
  GradientChecks(RankContext& context, DType dtype, std::size_t unit_count);

  // Compute stream: `unit`'s local gradient, `count` elements at `local` in device memory.
  void check_before_reduction(const FlatUnit& unit, const void* local, std::size_t count);
  // Comm stream, after the step's last reduction: the local norm over `units`' update ranges,
  // then every result read back to the host (waits for comm). `counted`, when not empty, says per
  // unit whether it adds to the norm (a pipeline stage's lent copy does not: its owner counts it).
  void inspect(const std::vector<FlatUnit>& units, const StagePlan& plan,
               const std::vector<bool>& counted = {});
  // What inspect() read.
  bool any_non_finite() const;
  double local_sum_of_squares() const { return read_.back().sum_of_squares; }
  // Compute stream: every result back to zero for the next step's reductions.
  void reset();

  // What inspect() read, for raise_divergence (engine/divergence_report.h): the first of `units`
  // whose local gradient was not finite.
  NonFiniteFinding finding(const std::vector<FlatUnit>& units) const;

 private:
  GradientStatistics* result(std::size_t index) { return results_.as<GradientStatistics>() + index; }

  RankContext& context_;
  DType dtype_;
  Buffer results_;                          // device memory
  std::vector<GradientStatistics> read_;  // the host's copy, from inspect()
};

}  // namespace zest
