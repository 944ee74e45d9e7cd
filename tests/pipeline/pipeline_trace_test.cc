// The trace shows the schedule: each rank's forward, backward, backward-input and
// backward-weight actions on its compute track and its sends on a send track, named as
// describe_action says. Also prints the idle fraction measured from the trace beside the
// simulator's prediction (for benchmarks/RESULTS.md; no assertion on timings).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"
#include "tests/pipeline/pipeline_test_support.h"

namespace zest::testing {
namespace {

std::shared_ptr<TraceRecorder> traced_run(ScheduleKind kind, int micro_batches, int steps,
                                          TestModel model = TestModel::kMlp) {
  auto trace = std::make_shared<TraceRecorder>();
  PipelineSpec spec;
  spec.model = model;
  spec.stages = 2;
  spec.pipeline.micro_batches = micro_batches;
  spec.pipeline.schedule = kind;
  spec.steps = steps;
  spec.rows = (model == TestModel::kWideMlp ? 64 : 16) * micro_batches;
  spec.configure_world = [&](WorldOptions& world) { world.trace = trace; };
  (void)train_pipeline(spec);
  return trace;
}

// The interpreter's slices ("backward-input of micro-batch 2"), not the engine's per-unit ones
// inside them ("backward-input layer1").
bool is_action(const std::string& name) {
  return name.find(" of micro-batch ") != std::string::npos &&
         (name.rfind("forward", 0) == 0 || name.rfind("backward", 0) == 0);
}

TEST(PipelineTrace, EachRankShowsItsActionsAndSends) {
  const auto trace = traced_run(ScheduleKind::kZeroBubbleH1, 4, 1);
  std::map<int, std::set<std::string>> names;
  for (const TraceRecorder::Slice& slice : trace->slices()) {
    names[slice.rank].insert(slice.track + ": " + slice.name);
  }
  EXPECT_TRUE(names[0].count("compute: forward of micro-batch 3"));
  EXPECT_TRUE(names[0].count("compute: backward-input of micro-batch 0"));
  EXPECT_TRUE(names[0].count("compute: backward-weight of micro-batch 0"));
  EXPECT_TRUE(names[0].count("send: send activations of micro-batch 2 to pipeline stage 1"));
  EXPECT_TRUE(names[1].count("send: send gradients of micro-batch 1 to pipeline stage 0"));
  EXPECT_TRUE(names[1].count("compute: backward-weight of micro-batch 3"));
}

// Idle fraction of the last step: over each stage, the time from the step's first action to its
// last not covered by an action slice.
TEST(PipelineTrace, MeasuredIdleFractionBesideThePrediction) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kZeroBubbleH1}) {
    for (int m : {4, 8}) {
      const auto trace = traced_run(kind, m, 3, TestModel::kWideMlp);
      // The last step's actions: each rank's last 2m (3m with the MLP's split backward).
      const std::size_t per_step = static_cast<std::size_t>((kind == ScheduleKind::kZeroBubbleH1 ? 3 : 2) * m);
      std::map<int, std::vector<TraceRecorder::Slice>> by_rank;
      for (const TraceRecorder::Slice& slice : trace->slices()) {
        if (slice.track == "compute" && is_action(slice.name)) by_rank[slice.rank].push_back(slice);
      }
      std::int64_t begin = INT64_MAX, end = 0;
      double busy = 0.0;
      for (auto& [rank, slices] : by_rank) {
        std::sort(slices.begin(), slices.end(),
                  [](const auto& x, const auto& y) { return x.begin_us < y.begin_us; });
        ASSERT_GE(slices.size(), per_step) << rank;
        for (std::size_t i = slices.size() - per_step; i < slices.size(); ++i) {
          begin = std::min(begin, slices[i].begin_us);
          end = std::max(end, slices[i].end_us);
          busy += static_cast<double>(slices[i].end_us - slices[i].begin_us);
        }
      }
      const double makespan = static_cast<double>(end - begin);
      const double measured = (2 * makespan - busy) / (2 * makespan);
      const ScheduleCosts costs;
      const double predicted = simulate_schedule(make_schedule(kind, 2, m), costs).idle_fraction;
      std::printf("idle fraction p=2 m=%d %-6s measured %.3f simulated %.3f\n", m,
                  std::string(schedule_kind_name(kind)).c_str(), measured, predicted);
    }
  }
}

}  // namespace
}  // namespace zest::testing
