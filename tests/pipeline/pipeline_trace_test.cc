// The trace shows the schedule: each rank's forward, backward, backward-input and
// backward-weight actions on its compute track and its sends on a send track, named as
// describe_action says, each with its compute thread's CPU time (in the written trace too). Also
// prints the idle fraction measured from the trace beside the simulator's prediction (no
// assertion on timings; benchmarks/pipeline_bubble_bench.cc is the measurement).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "pipeline/measured_bubble.h"
#include "pipeline/schedule_generators.h"
#include "pipeline/schedule_simulator.h"
#include "tests/pipeline/pipeline_test_support.h"
#include "tests/support/scratch_directory.h"

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

// On the CPU device each action slice carries its compute thread's CPU time: what the bubble
// benchmark measures busy time with when ranks outnumber the cores.
TEST(PipelineTrace, EachActionCarriesItsThreadsCpuTime) {
  const auto trace = traced_run(ScheduleKind::kOneFOneB, 4, 2, TestModel::kWideMlp);
  int actions = 0;
  std::int64_t cpu = 0;
  for (const TraceRecorder::Slice& slice : trace->slices()) {
    if (slice.track != "compute" || !is_pipeline_action(slice.name)) continue;
    ++actions;
    EXPECT_GE(slice.cpu_us, 0) << slice.name;
    cpu += slice.cpu_us;
  }
  EXPECT_EQ(actions, 2 * 2 * 2 * 4);  // ranks x steps x (forward, backward) x micro-batches
  EXPECT_GT(cpu, 0);  // the wide MLP's products take milliseconds
  const MeasuredBubble measured = measure_last_step_bubble(trace->slices(), 2);
  EXPECT_GE(measured.cpu_idle_fraction, 0.0);
  EXPECT_LT(measured.cpu_idle_fraction, 1.0);
}

// The written trace (Perfetto, chrome://tracing) shows the CPU time as an argument of each action.
class PipelineTraceFile : public ScratchDirectoryTest {};

TEST_F(PipelineTraceFile, EachActionEventCarriesItsCpuTime) {
  const auto trace = traced_run(ScheduleKind::kOneFOneB, 2, 1);
  trace->write(path("trace.json"));
  std::ifstream in(path("trace.json"));
  const nlohmann::json written = nlohmann::json::parse(in);
  int actions = 0;
  for (const auto& event : written["traceEvents"]) {
    if (event["ph"] != "X" || !is_pipeline_action(event["name"].get<std::string>())) continue;
    ++actions;
    ASSERT_TRUE(event.contains("args")) << event.dump();
    EXPECT_GE(event["args"]["cpu_us"].get<std::int64_t>(), 0) << event.dump();
  }
  EXPECT_EQ(actions, 2 * 2 * 2);  // ranks x (forward, backward) x micro-batches
}

// Idle fraction of the last step (pipeline/measured_bubble.h): over each pipeline stage, the time
// from the step's first action to its last not covered by an action slice.
TEST(PipelineTrace, MeasuredIdleFractionBesideThePrediction) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kZeroBubbleH1}) {
    for (int m : {4, 8}) {
      const auto trace = traced_run(kind, m, 3, TestModel::kWideMlp);
      const MeasuredBubble measured = measure_last_step_bubble(trace->slices(), 3);
      ASSERT_EQ(measured.ranks, 2);
      const ScheduleCosts costs;
      const double predicted = simulate_schedule(make_schedule(kind, 2, m), costs).idle_fraction;
      std::printf("idle fraction p=2 m=%d %-6s measured %.3f simulated %.3f\n", m,
                  std::string(schedule_kind_name(kind)).c_str(), measured.idle_fraction,
                  predicted);
    }
  }
}

}  // namespace
}  // namespace zest::testing
