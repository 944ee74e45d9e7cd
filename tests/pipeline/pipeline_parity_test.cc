// Pipeline stages × data-parallel ranks, as threads, against one rank training the same global
// batch: every loss and every final parameter within 1e-6 relative (+1e-7 absolute), for the MLP
// and the GPT (whose head borrows the embedding across the first and last pipeline stage), every
// ZeRO pipeline stage, every schedule.
#include <gtest/gtest.h>

#include <string>

#include "tests/pipeline/pipeline_test_support.h"

namespace zest::testing {
namespace {

const TrainResult& reference(TestModel model) {
  static const TrainResult mlp = train_single(TestModel::kMlp, 3, 48);
  static const TrainResult gpt = train_single(TestModel::kGpt, 3, 48);
  return model == TestModel::kMlp ? mlp : gpt;
}

void expect_parity(const PipelineSpec& spec, const std::string& what) {
  const TrainResult run = train_pipeline(spec);
  std::string where;
  const double worst = worst_relative_difference(reference(spec.model), run, &where);
  EXPECT_LE(worst, 1.0) << what << ": worst at " << where;
  // forward_backward returns the step's loss on every rank.
  for (std::size_t rank = 0; rank < run.losses_by_rank.size(); ++rank) {
    EXPECT_EQ(run.losses_by_rank[rank], run.losses) << what << ", rank " << rank;
  }
}

PipelineSpec spec_of(TestModel model, int pipeline_stages, int data_parallel, int zero_stage,
                     ScheduleKind schedule, int micro_batches, int chunks = 1) {
  PipelineSpec spec;
  spec.model = model;
  spec.stages = pipeline_stages;
  spec.data_parallel = data_parallel;
  spec.zero_stage = zero_stage;
  spec.pipeline.schedule = schedule;
  spec.pipeline.micro_batches = micro_batches;
  spec.pipeline.virtual_chunks = chunks;
  return spec;
}

std::string name_of(TestModel model, int p, int d, int zero, ScheduleKind kind, int m) {
  return std::string(model == TestModel::kMlp ? "mlp " : "gpt ") + std::to_string(p) + "x" +
         std::to_string(d) + " zero " + std::to_string(zero) + " " +
         std::string(schedule_kind_name(kind)) + " m " + std::to_string(m);
}

TEST(PipelineParity, MeshShapesMatchOneRank) {
  for (TestModel model : {TestModel::kMlp, TestModel::kGpt}) {
    // 1×4: data parallelism only; 4×1 and 3×1: units that do not divide by the pipeline stages.
    for (auto [p, d] : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}, {4, 1}, {3, 1}}) {
      expect_parity(spec_of(model, p, d, 1, ScheduleKind::kOneFOneB, 4),
                    name_of(model, p, d, 1, ScheduleKind::kOneFOneB, 4));
    }
  }
}

TEST(PipelineParity, EveryZeroStageInsideTwoByTwo) {
  for (TestModel model : {TestModel::kMlp, TestModel::kGpt}) {
    for (int zero = 0; zero <= 3; ++zero) {
      expect_parity(spec_of(model, 2, 2, zero, ScheduleKind::kOneFOneB, 4),
                    name_of(model, 2, 2, zero, ScheduleKind::kOneFOneB, 4));
    }
  }
}

TEST(PipelineParity, EveryScheduleInsideTwoByTwo) {
  for (TestModel model : {TestModel::kMlp, TestModel::kGpt}) {
    for (int zero : {1, 3}) {
      expect_parity(spec_of(model, 2, 2, zero, ScheduleKind::kGPipe, 4),
                    name_of(model, 2, 2, zero, ScheduleKind::kGPipe, 4));
      expect_parity(spec_of(model, 2, 2, zero, ScheduleKind::kZeroBubbleH1, 4),
                    name_of(model, 2, 2, zero, ScheduleKind::kZeroBubbleH1, 4));
      expect_parity(spec_of(model, 2, 2, zero, ScheduleKind::kInterleavedOneFOneB, 4, 2),
                    name_of(model, 2, 2, zero, ScheduleKind::kInterleavedOneFOneB, 4) + " v 2");
    }
  }
}

TEST(PipelineParity, FewerMicroBatchesThanStagesAndAnExplicitPartition) {
  expect_parity(spec_of(TestModel::kMlp, 4, 1, 2, ScheduleKind::kOneFOneB, 2),
                "mlp 4x1 1f1b m 2");
  PipelineSpec spec = spec_of(TestModel::kGpt, 3, 1, 2, ScheduleKind::kZeroBubbleH1, 3);
  spec.pipeline.units_per_virtual_stage = {1, 4, 1};  // embedding | blocks | head
  expect_parity(spec, "gpt 3x1 zb_h1 partition 1,4,1");
}

TEST(PipelineParity, StageThreeKeepsUnitsGatheredAcrossMicroBatches) {
  for (TestModel model : {TestModel::kMlp, TestModel::kGpt}) {
    PipelineSpec spec = spec_of(model, 2, 2, 3, ScheduleKind::kOneFOneB, 4);
    spec.pipeline.reshard_after_forward = false;
    expect_parity(spec, name_of(model, 2, 2, 3, ScheduleKind::kOneFOneB, 4) +
                            " reshard_after_forward false");
  }
}

// Clipping needs the whole model's norm: every pipeline stage's share, the tied embedding once.
TEST(PipelineParity, GradientClippingSeesTheWholeModelsNorm) {
  for (TestModel model : {TestModel::kMlp, TestModel::kGpt}) {
    const TrainResult single = train_single(model, 3, 48, 1, 0.05f);
    ASSERT_GT(single.grad_norms.front(), 0.05f);  // the clip acts
    for (int zero : {0, 3}) {
      PipelineSpec spec = spec_of(model, 2, 2, zero, ScheduleKind::kOneFOneB, 4);
      spec.configure_engine = [](EngineOptions& options) { options.gradient_clipping = 0.05f; };
      const TrainResult run = train_pipeline(spec);
      std::string where;
      EXPECT_LE(worst_relative_difference(single, run, &where), 1.0)
          << name_of(model, 2, 2, zero, ScheduleKind::kOneFOneB, 4) << ": " << where;
    }
  }
}

// reshard_after_forward false: a pipeline stage's units stay gathered through the step's
// micro-batches (the wide MLP's three 512 × 512 layers share a size class of two ring slots
// otherwise).
TEST(PipelineParity, ReshardAfterForwardFalseKeepsEveryUnitGathered) {
  for (bool reshard : {true, false}) {
    PipelineSpec spec = spec_of(TestModel::kWideMlp, 1, 2, 3, ScheduleKind::kOneFOneB, 2);
    spec.steps = 1;
    spec.rows = 8;
    spec.pipeline.reshard_after_forward = reshard;
    std::size_t gathered = 0;
    spec.after_forward_backward = [&](int rank, PipelineTrainer& trainer) {
      if (rank == 0) gathered = trainer.chunk_trainer(0).gathered_units();
    };
    (void)train_pipeline(spec);
    if (reshard) {
      EXPECT_LT(gathered, 5u);
    } else {
      EXPECT_EQ(gathered, 5u);
    }
  }
}

// Recomputation inside a pipeline stage (the common case): each micro-batch's units rebuild
// their activations before their backward, on the micro-batch's own Unit objects.
TEST(PipelineParity, RecomputationInsideStages) {
  for (RecomputePolicy policy : {RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
    for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
      for (TestModel model : {TestModel::kMlp, TestModel::kGpt}) {
        // Only GPT blocks recompute selectively (the MLP refuses it as a config error).
        if (policy == RecomputePolicy::kSelective && model == TestModel::kMlp) continue;
        PipelineSpec spec = spec_of(model, 2, 2, 2, kind, 4);
        spec.configure_engine = [policy](EngineOptions& options) {
          options.activation_checkpointing.policy = policy;
        };
        expect_parity(spec, name_of(model, 2, 2, 2, kind, 4) +
                                (policy == RecomputePolicy::kFull ? " full" : " selective") +
                                " recomputation");
      }
    }
  }
}

// The optimizer offloaded inside pipeline stages: the GPT's token table, tied across the first
// and last pipeline stage, is summed on the device after its reductions, where the offloaded
// optimizer had already taken the shard to the host; it takes the sum there again. Host memory
// and NVMe, every sharded ZeRO stage, the interleaved schedule too.
TEST(PipelineParity, AnOffloadedOptimizerUpdatesTheTiedTokenTableFromItsSum) {
  const std::string nvme = ::testing::TempDir() + "pipeline_parity_nvme";
  struct Case {
    int zero;
    OffloadDevice device;
    ScheduleKind kind;
    int chunks;
  };
  for (const Case& c : {Case{1, OffloadDevice::kCpu, ScheduleKind::kOneFOneB, 1},
                        Case{2, OffloadDevice::kCpu, ScheduleKind::kInterleavedOneFOneB, 2},
                        Case{3, OffloadDevice::kCpu, ScheduleKind::kZeroBubbleH1, 1},
                        Case{2, OffloadDevice::kNvme, ScheduleKind::kOneFOneB, 1}}) {
    PipelineSpec spec = spec_of(TestModel::kGpt, 2, 2, c.zero, c.kind, 4, c.chunks);
    spec.configure_engine = [&](EngineOptions& options) {
      options.offload_optimizer.device = c.device;
      options.offload_optimizer.nvme_path = nvme;
    };
    expect_parity(
        spec, name_of(TestModel::kGpt, 2, 2, c.zero, c.kind, 4) +
                  (c.device == OffloadDevice::kCpu ? " offloaded to cpu" : " offloaded to nvme"));
  }
}

}  // namespace
}  // namespace zest::testing
