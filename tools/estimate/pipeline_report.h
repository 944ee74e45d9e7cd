// How zest-estimate shows a config with pipeline stages: the schedule's bubble (simulated beside
// the closed formula) and micro-batches in flight, then each pipeline stage's peak per rank by
// category with its units, and the verdict against the capacity for the largest pipeline stage; as
// text or as the `pipeline` member of --json.
#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

#include "tools/common/memory_estimate.h"

namespace zest {

void print_pipeline_estimate(const EstimateJob& job, const PipelineEstimate& estimate,
                             std::size_t capacity);

nlohmann::ordered_json pipeline_json(const PipelineEstimate& estimate, std::size_t capacity);

}  // namespace zest
