// How zest-estimate shows a plan: per rank, the peak bytes of each category, the device total
// and the host and NVMe tiers by category, the verdict against a device capacity with the planner's
// advice, and the --fit table; as text for people or as one JSON document (--json).
#pragma once

#include <array>

#include <cstddef>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/common/memory_estimate.h"
#include "tools/common/offload_fit.h"

namespace zest {

void print_estimate(const EstimateJob& job, const PeakPrediction& prediction,
                    std::size_t capacity);
void print_fit(const std::vector<StageFit>& fits, std::size_t capacity, int world,
               bool parameter_mode);

nlohmann::ordered_json estimate_json(const EstimateJob& job, const PeakPrediction& prediction,
                                     std::size_t capacity);
nlohmann::ordered_json fit_json(const std::vector<StageFit>& fits);
// --fit's offload proposal (tools/common/offload_fit.h): one line, and its rungs as JSON.
void print_offload_fit(const std::vector<OffloadRung>& ladder, const TierCapacities& capacities);
nlohmann::ordered_json offload_fit_json(const std::vector<OffloadRung>& ladder,
                                        const TierCapacities& capacities);

// A tier's bytes by category and its total, as --json writes a tier ("host", "nvme").
nlohmann::ordered_json tier_json(const std::array<std::size_t, kCategoryCount>& bytes,
                                 std::size_t total);

}  // namespace zest
