// Shared by the vocabulary-pieces planner tests: a GPT's plan at a stage and world, and the
// allocator's peaks against it over a few runs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/recompute.h"
#include "models/gpt.h"
#include "planner/peak_plan.h"
#include "tests/planner/gpt_plan_support.h"
#include "tests/planner/measured_peaks.h"
#include "runtime/world.h"

namespace zest::pieces_support {

inline EngineOptions at_stage(int stage, DType dtype = DType::kFloat32) {
  EngineOptions options;
  options.stage = stage;
  options.compute_dtype = dtype;
  options.communication_dtype = dtype;
  return options;
}

inline PeakPrediction plan_gpt(const GptConfig& config, std::int64_t sequences, int stage,
                               int world, DType dtype = DType::kFloat32, int accumulation = 1,
                               RecomputePolicy recompute = RecomputePolicy::kNone) {
  return predict_peak(testing::gpt_plan_input(
      config, sequences, testing::engine_options(stage, dtype, accumulation, recompute), world));
}

inline std::size_t working_memory(const PeakPrediction& prediction) {
  return prediction.of(Category::kGather) + prediction.of(Category::kBuckets);
}

inline std::vector<MemoryUsage> train(const GptConfig& config, std::int64_t sequences, int world,
                                      DType dtype, int accumulation, RecomputePolicy recompute) {
  WorldOptions world_options;
  world_options.ranks = world;
  return testing::gpt_usage_after_two_steps(
      config, sequences, testing::engine_options(3, dtype, accumulation, recompute), world_options);
}

// Stage 3: every category's peak on every rank equals the plan. Frees run in stream order, so a
// host descheduled on a loaded machine measures less (never more): the largest peaks of up to
// twelve runs must reach the plan (one core shared by the host and its streams misses it about
// one run in three).
inline void expect_measured_equals_planned(const GptConfig& config, std::int64_t sequences,
                                           int world, DType dtype, int accumulation,
                                           RecomputePolicy recompute = RecomputePolicy::kNone) {
  const PeakPrediction planned =
      plan_gpt(config, sequences, 3, world, dtype, accumulation, recompute);
  testing::expect_largest_peaks_equal_plan(planned, [&] {
    return train(config, sequences, world, dtype, accumulation, recompute);
  });
}

}  // namespace zest::pieces_support
