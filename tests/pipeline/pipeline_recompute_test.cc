// Recomputation inside pipeline stages (activation_checkpointing with a pipeline): each chunk
// recomputes what the whole model's plan gives its units (EngineOptions::recompute_plan), as the
// planner and the config's `recomputed` list say — a pipeline stage of the embedding alone
// recomputes nothing rather than failing, and a chunk's last unit recomputes — and the run trains
// to the bit as the same pipeline without recomputation, for every schedule.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

#include "tests/pipeline/pipeline_test_support.h"

namespace zest::testing {
namespace {

struct RecomputeCase {
  ScheduleKind schedule;
  int pipeline_stages;
  int chunks;
  int zero_stage;
  RecomputePolicy policy;
};

PipelineSpec spec_of(const RecomputeCase& run, RecomputePolicy policy) {
  PipelineSpec spec;
  spec.model = TestModel::kGpt;
  spec.stages = run.pipeline_stages;
  spec.data_parallel = 4 / run.pipeline_stages;
  spec.zero_stage = run.zero_stage;
  spec.pipeline.schedule = run.schedule;
  spec.pipeline.micro_batches = 4;
  spec.pipeline.virtual_chunks = run.chunks;
  spec.steps = 2;
  spec.rows = 16;
  spec.configure_engine = [policy](EngineOptions& options) {
    options.activation_checkpointing.policy = policy;
  };
  return spec;
}

std::string name_of(const RecomputeCase& run) {
  return std::string(schedule_kind_name(run.schedule)) + " " + std::to_string(run.pipeline_stages) +
         " pipeline stages x " + std::to_string(run.chunks) + " chunks, zero " +
         std::to_string(run.zero_stage) + ", " + recompute_policy_name(run.policy);
}

TEST(PipelineRecompute, RecomputesTheWholeModelsPlanAndTrainsToTheBit) {
  const RecomputeCase cases[] = {
      {ScheduleKind::kOneFOneB, 2, 1, 3, RecomputePolicy::kFull},
      {ScheduleKind::kGPipe, 4, 1, 0, RecomputePolicy::kFull},
      {ScheduleKind::kInterleavedOneFOneB, 2, 2, 1, RecomputePolicy::kSelective},
      {ScheduleKind::kZeroBubbleH1, 2, 1, 2, RecomputePolicy::kFull},
  };
  for (const RecomputeCase& run : cases) {
    const TrainResult plain = train_pipeline(spec_of(run, RecomputePolicy::kNone));
    auto trace = std::make_shared<TraceRecorder>();
    PipelineSpec spec = spec_of(run, run.policy);
    spec.configure_world = [&](WorldOptions& world) { world.trace = trace; };
    const TrainResult recomputed = train_pipeline(spec);
    // The whole model's plan: every block (the first pipeline stage's last unit among them),
    // never the embedding (its gradient replaces its parameters) nor the head (the last unit).
    std::set<std::string> units;
    for (const TraceRecorder::Slice& slice : trace->slices()) {
      if (slice.name.rfind("recompute ", 0) == 0) units.insert(slice.name.substr(10));
    }
    EXPECT_EQ(units, (std::set<std::string>{"block0", "block1", "block2", "block3"}))
        << name_of(run);
    // Recomputation runs the same forward again: bit-identical.
    ASSERT_EQ(recomputed.losses.size(), plain.losses.size()) << name_of(run);
    EXPECT_EQ(recomputed.losses, plain.losses) << name_of(run);
    EXPECT_EQ(recomputed.grad_norms, plain.grad_norms) << name_of(run);
    EXPECT_EQ(recomputed.params, plain.params) << name_of(run);
  }
}

}  // namespace
}  // namespace zest::testing
