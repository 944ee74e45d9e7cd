// How a model's units are split into the pipeline's virtual stages: a contiguous run of units
// per virtual stage (chunk c of pipeline stage s is virtual stage c·p + s, schedule.h), given as
// the number of units each holds, in order. Four ways: uniformly, by parameter count, by costs
// the caller computes per unit and virtual stage (the planner's memory per virtual stage), or a list
// the user writes. Invariant: the result has one entry per virtual stage, none zero, summing to
// the model's units; anything else is a one-line kConfig Error naming `pipeline.partition`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace zest {

enum class PartitionMethod { kUniform, kParameters, kMemory, kExplicit };

// The config's names: "uniform", "parameters", "memory" (an explicit list has none).
std::string_view partition_method_name(PartitionMethod method);

// units / V each, the remainder one more on the first virtual stages (as DeepSpeed's
// partition_uniform, so the last pipeline stage, which also holds the loss, is never the larger).
std::vector<std::size_t> uniform_partition(std::size_t units, int virtual_stages);

// The cost of `unit` when virtual stage `virtual_stage` holds it. A pipeline stage's cost is the
// sum of its units' costs; costs may depend on the pipeline stage (a unit's activations weigh more
// on a pipeline stage that holds more micro-batches in flight).
using UnitCost = std::function<std::uint64_t(int virtual_stage, std::size_t unit)>;

// The contiguous split, no pipeline stage empty, that minimizes the largest pipeline stage's cost.
// Algorithm: a binary search on the bound T over [0, 2^64 - 1]; for each T a greedy pass gives
// every virtual stage in order as many units as fit under T (leaving one per later pipeline stage),
// which succeeds iff any split with all pipeline stages <= T exists (the greedy boundaries are
// never behind a feasible split's, by induction over the pipeline stages). At most 64 · units cost
// calls. Ties: of the optimal splits, the greedy one (earlier pipeline stages as full as they may
// be).
std::vector<std::size_t> balanced_partition(std::size_t units, int virtual_stages,
                                            const UnitCost& cost);
// The same with one cost per unit on every pipeline stage (parameter counts: "parameters").
std::vector<std::size_t> balanced_partition(const std::vector<std::uint64_t>& unit_costs,
                                            int virtual_stages);

// Checks a list the user wrote (`pipeline.partition`: [3, 3, 2]) against the model's units.
std::vector<std::size_t> explicit_partition(const std::vector<std::size_t>& units_per_stage,
                                            std::size_t units, int virtual_stages);

// The index of each virtual stage's first unit, and one past the last: V + 1 entries.
std::vector<std::size_t> partition_boundaries(const std::vector<std::size_t>& units_per_stage);

}  // namespace zest
