// Each pipeline stage's measured peak equals its plan (planner/pipeline_plan.h) to the byte, in
// every category, on ranks as threads (the CPU device): GPipe and 1F1B at 2x2 and 4x1 (pipeline
// pipeline stages x data-parallel ranks) at ZeRO stages 0-3, ZB-H1 (a split unit's backward
// workspace held from B to W), interleaved 1F1B, on the MLP and the GPT (its embedding tied to the
// head's pipeline stage), with the optimizer offloaded too. GPipe holds every micro-batch, 1F1B at
// most p - s on pipeline stage s: the plans show both.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "optim/optimizer.h"
#include "pipeline/pipeline_trainer.h"
#include "pipeline/schedule_generators.h"
#include "planner/pipeline_plan.h"
#include "runtime/world.h"
#include "tests/pipeline/pipeline_test_support.h"
#include "tests/planner/measured_peaks.h"

namespace zest::testing {
namespace {

struct Case {
  TestModel model = TestModel::kMlp;
  int pipeline_stages = 2;
  int data_parallel = 2;
  int zero = 0;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;
  int micro_batches = 4;
  bool offload_optimizer = false;  // to host memory

  int chunks() const { return schedule == ScheduleKind::kInterleavedOneFOneB ? 2 : 1; }
  std::int64_t rows() const { return 8 * data_parallel * micro_batches; }  // 8 per micro-batch
  std::string name() const {
    return std::string(is_mlp(model) ? "mlp " : "gpt ") + std::to_string(pipeline_stages) + "x" +
           std::to_string(data_parallel) + " zero " + std::to_string(zero) + " " +
           std::string(schedule_kind_name(schedule)) + (offload_optimizer ? " offloaded" : "");
  }
  EngineOptions engine() const {
    EngineOptions options;
    options.stage = zero;
    if (offload_optimizer) options.offload_optimizer.device = OffloadDevice::kCpu;
    return options;
  }
  PipelineOptions options() const {
    PipelineOptions options;
    options.stages = pipeline_stages;
    options.micro_batches = micro_batches;
    options.schedule = schedule;
    options.virtual_chunks = chunks();
    return options;
  }
};

// Two steps; every rank's allocator usage after them.
std::vector<MemoryUsage> measure(const Case& c) {
  std::vector<MemoryUsage> usage(static_cast<std::size_t>(c.pipeline_stages * c.data_parallel));
  WorldOptions world;
  world.ranks = c.pipeline_stages * c.data_parallel;
  world.hold_frees = true;  // frees when a wait proves them, as the plan replays
  World(world).run([&](RankContext& context) {
    const EngineOptions options = c.engine();
    PipelineTrainer trainer(context, options, c.options(), model_factory(c.model),
                            test_optimizer(c.model));
    const std::int64_t local = c.rows() / c.data_parallel;
    const std::int64_t first = trainer.mesh().coordinate(context.rank).data_parallel_index * local;
    for (int s = 0; s < 2; ++s) {
      GlobalBatch batch = make_batch(c.model, s, c.rows());
      trainer.forward_backward(batch.rows_of(first, local));
      trainer.step();
    }
    context.synchronize();
    MemoryUsage mine = context.allocator().usage();
    // The offloaded optimizer's state lives in the host arena; the plan counts it as offload.
    const auto offload = static_cast<std::size_t>(Category::kOffload);
    mine.peak[offload] = context.device.host_allocator().usage().peak[offload];
    usage[static_cast<std::size_t>(context.rank)] = mine;
  });
  return usage;
}

std::vector<PipelineStagePeak> plan(const Case& c) {
  std::unique_ptr<Module> model = model_factory(c.model)();
  EngineOptions options = c.engine();
  options.gradient_accumulation_steps = c.micro_batches;
  const std::int64_t width = is_mlp(c.model) ? kMlpSizes.front() : kGptConfig.seq_len;
  PipelinePlanInput input;
  input.model = plan_input(*model, {8, width}, options,
                           make_optimizer(test_optimizer(c.model))->state_count(),
                           c.data_parallel);
  input.units_per_virtual_stage = c.options().partition(model->units().size());
  input.schedule = make_schedule(c.schedule, c.pipeline_stages, c.micro_batches, c.chunks());
  return predict_pipeline_peaks(input);
}

// Frees run in stream order, so a host descheduled on a loaded machine measures less (never
// more): the largest peaks of up to twelve runs must reach the plan.
void expect_measured_equals_planned(const Case& c) {
  SCOPED_TRACE(c.name());
  const std::vector<PipelineStagePeak> planned = plan(c);
  const auto stage_of = [&](std::size_t rank) -> const PeakPrediction& {
    return planned.at(rank / static_cast<std::size_t>(c.data_parallel)).peak;
  };
  testing::expect_largest_peaks_equal_plans(stage_of, [&] { return measure(c); });
}

using Mesh = std::pair<int, int>;
const std::vector<Mesh> kMeshes = {{2, 2}, {4, 1}};

TEST(PipelineMeasured, GPipeEveryZeroStageEqualsThePlan) {
  for (auto [p, d] : kMeshes) {
    for (int zero = 0; zero <= 3; ++zero) {
      expect_measured_equals_planned({TestModel::kMlp, p, d, zero, ScheduleKind::kGPipe});
    }
  }
}

TEST(PipelineMeasured, OneFOneBEveryZeroStageEqualsThePlan) {
  for (auto [p, d] : kMeshes) {
    for (int zero = 0; zero <= 3; ++zero) {
      expect_measured_equals_planned({TestModel::kMlp, p, d, zero, ScheduleKind::kOneFOneB});
    }
  }
}

TEST(PipelineMeasured, ZeroBubbleHoldsTheSplitBackwardsWorkspaceUntilW) {
  for (auto [p, d] : kMeshes) {
    for (int zero = 0; zero <= 3; ++zero) {
      expect_measured_equals_planned({TestModel::kMlp, p, d, zero, ScheduleKind::kZeroBubbleH1});
    }
  }
  // The GPT's blocks split their backward and keep its workspace between B and W.
  expect_measured_equals_planned({TestModel::kGpt, 4, 1, 1, ScheduleKind::kZeroBubbleH1});
}

TEST(PipelineMeasured, GptAndInterleavedEqualThePlan) {
  for (int zero = 0; zero <= 3; ++zero) {
    expect_measured_equals_planned({TestModel::kGpt, 2, 2, zero, ScheduleKind::kOneFOneB});
  }
  expect_measured_equals_planned({TestModel::kGpt, 2, 2, 1, ScheduleKind::kGPipe});
  expect_measured_equals_planned({TestModel::kGpt, 2, 2, 1, ScheduleKind::kInterleavedOneFOneB});
  expect_measured_equals_planned({TestModel::kMlp, 2, 2, 3, ScheduleKind::kInterleavedOneFOneB});
}

// The optimizer offloaded inside pipeline stages, the GPT's tied token table included: the
// device holds no optimizer state, and the plan says so to the byte.
TEST(PipelineMeasured, AnOffloadedOptimizerEqualsThePlan) {
  for (int zero = 1; zero <= 3; ++zero) {
    expect_measured_equals_planned({TestModel::kGpt, 2, 2, zero, ScheduleKind::kOneFOneB, 4, true});
  }
  expect_measured_equals_planned({TestModel::kMlp, 2, 2, 2, ScheduleKind::kGPipe, 4, true});
}

// GPipe keeps all m micro-batches on every pipeline stage, 1F1B at most p - s on pipeline stage s.
TEST(PipelineMeasured, GPipeHoldsEveryMicroBatchOneFOneBAtMostTheStages) {
  for (auto [p, d] : kMeshes) {
    const auto gpipe = plan({TestModel::kMlp, p, d, 0, ScheduleKind::kGPipe, 8});
    const auto one_f_one_b = plan({TestModel::kMlp, p, d, 0, ScheduleKind::kOneFOneB, 8});
    for (int s = 0; s < p; ++s) {
      EXPECT_EQ(gpipe[s].peak_in_flight, 8);
      EXPECT_EQ(one_f_one_b[s].peak_in_flight, p - s);
      EXPECT_GT(gpipe[s].peak.of(Category::kActivations),
                one_f_one_b[s].peak.of(Category::kActivations));
    }
  }
}

}  // namespace
}  // namespace zest::testing
