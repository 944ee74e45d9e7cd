#include "pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "base/error.h"

namespace zest {
namespace {

constexpr std::uint64_t kMaxCost = std::numeric_limits<std::uint64_t>::max();

[[noreturn]] void partition_error(const std::string& message) {
  throw Error(ErrorKind::kConfig, "pipeline.partition: " + message);
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return a > kMaxCost - b ? kMaxCost : a + b;
}

void check_shape(std::size_t units, int virtual_stages) {
  if (virtual_stages < 1) {
    partition_error("needs at least one virtual stage, got " + std::to_string(virtual_stages));
  }
  if (units < static_cast<std::size_t>(virtual_stages)) {
    partition_error("the model has " + std::to_string(units) + " unit" +
                    (units == 1 ? "" : "s") + ", fewer than its " +
                    std::to_string(virtual_stages) +
                    " virtual stages (pipeline.stages x pipeline.virtual_chunks); every virtual "
                    "stage needs at least one unit");
  }
}

// The greedy pass of balanced_partition: each virtual stage as many units as fit under `bound`,
// leaving at least one unit for each later pipeline stage. Empty when some pipeline stage cannot
// take even one.
std::vector<std::size_t> greedy_split(std::size_t units, int virtual_stages,
                                      const UnitCost& cost, std::uint64_t bound) {
  std::vector<std::size_t> counts;
  std::size_t next = 0;
  for (int v = 0; v < virtual_stages; ++v) {
    const std::size_t later = static_cast<std::size_t>(virtual_stages - 1 - v);
    const std::size_t last_allowed = units - later;  // one past the last unit v may take
    std::uint64_t sum = 0;
    std::size_t end = next;
    while (end < last_allowed) {
      const std::uint64_t with = saturating_add(sum, cost(v, end));
      if (with > bound) break;
      sum = with;
      ++end;
    }
    // The last pipeline stage takes everything left, and must fit too.
    if (end == next || (later == 0 && end != units)) return {};
    counts.push_back(end - next);
    next = end;
  }
  return counts;
}

}  // namespace

std::string_view partition_method_name(PartitionMethod method) {
  switch (method) {
    case PartitionMethod::kUniform: return "uniform";
    case PartitionMethod::kParameters: return "parameters";
    case PartitionMethod::kMemory: return "memory";
    case PartitionMethod::kExplicit: return "explicit";
  }
  return "?";
}

std::vector<std::size_t> uniform_partition(std::size_t units, int virtual_stages) {
  check_shape(units, virtual_stages);
  const std::size_t v = static_cast<std::size_t>(virtual_stages);
  std::vector<std::size_t> counts(v, units / v);
  for (std::size_t i = 0; i < units % v; ++i) ++counts[i];
  return counts;
}

std::vector<std::size_t> balanced_partition(std::size_t units, int virtual_stages,
                                            const UnitCost& cost) {
  check_shape(units, virtual_stages);
  // The bound lies in [0, 2^64 - 1], the top always fitting (sums saturate there): at most 64
  // greedy passes.
  std::uint64_t high = kMaxCost;
  std::vector<std::size_t> best = greedy_split(units, virtual_stages, cost, 0);
  if (!best.empty()) return best;  // every unit costs nothing
  best = greedy_split(units, virtual_stages, cost, high);
  std::uint64_t low = 0;  // does not fit; the answer lies in (low, high]
  while (high - low > 1) {
    const std::uint64_t middle = low + (high - low) / 2;
    std::vector<std::size_t> split = greedy_split(units, virtual_stages, cost, middle);
    if (split.empty()) {
      low = middle;
    } else {
      high = middle;
      best = std::move(split);
    }
  }
  return best;
}

std::vector<std::size_t> balanced_partition(const std::vector<std::uint64_t>& unit_costs,
                                            int virtual_stages) {
  return balanced_partition(unit_costs.size(), virtual_stages,
                            [&](int, std::size_t unit) { return unit_costs[unit]; });
}

std::vector<std::size_t> explicit_partition(const std::vector<std::size_t>& units_per_stage,
                                            std::size_t units, int virtual_stages) {
  check_shape(units, virtual_stages);
  if (units_per_stage.size() != static_cast<std::size_t>(virtual_stages)) {
    partition_error("lists " + std::to_string(units_per_stage.size()) + " entr" +
                    (units_per_stage.size() == 1 ? "y" : "ies") + ", not one per virtual stage (" +
                    std::to_string(virtual_stages) +
                    ": pipeline.stages x pipeline.virtual_chunks)");
  }
  std::size_t sum = 0;
  for (std::size_t i = 0; i < units_per_stage.size(); ++i) {
    if (units_per_stage[i] == 0) {
      partition_error("[" + std::to_string(i) + "] is 0: virtual stage " + std::to_string(i) +
                      " would hold no unit; every virtual stage needs at least one");
    }
    sum += units_per_stage[i];
  }
  if (sum != units) {
    partition_error("the list sums to " + std::to_string(sum) + " units, but the model has " +
                    std::to_string(units) + (sum < units ? " (units would be dropped)" : ""));
  }
  return units_per_stage;
}

std::vector<std::size_t> partition_boundaries(const std::vector<std::size_t>& units_per_stage) {
  std::vector<std::size_t> boundaries{0};
  for (std::size_t count : units_per_stage) boundaries.push_back(boundaries.back() + count);
  return boundaries;
}

}  // namespace zest
