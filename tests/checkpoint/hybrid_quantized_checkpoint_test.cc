// Checkpoints of a hybrid-sharded run with qgZ (and qwZ): the replicas' mean crosses quantized and
// every replica dequantizes it from the same bytes, so the shard groups still hold the same state
// to the bit — the save's hash of each group against the first passes, one group writes — and the
// same layout resumes bit for bit. Ranks are threads.
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/manifest.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

TrainSpec quantized_hybrid(int stage, bool weights) {
  TrainSpec spec;
  spec.world = 4;
  spec.stage = stage;
  spec.configure_engine = [weights](EngineOptions& engine) {
    engine.hybrid_shard_size = 2;
    engine.quantized_gradients = true;
    engine.quantized_weights = weights;
  };
  return spec;
}

class HybridQuantizedCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(HybridQuantizedCheckpoint, ReplicasAgreeSoOneGroupSavesAndTheRunResumesBitIdentically) {
  const int stage = GetParam();
  ScratchDirectory scratch;
  const TrainSpec spec = quantized_hybrid(stage, stage == 3);
  const TrainResult reference = train_mlp(spec);
  TrainSpec half = spec;
  half.steps = 3;
  half.save_dir = scratch.path("ckpt");
  half.save_at = 3;
  train_mlp(half);  // a replica that drifted would fail the save, naming both ranks
  const CheckpointManifest manifest = read_manifest(scratch.path("ckpt") + "/step-3");
  EXPECT_EQ(manifest.world_size, 2);
  EXPECT_EQ(manifest.hybrid_replicas, 2);

  TrainSpec resume = spec;
  resume.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(resume);
  EXPECT_EQ(resumed.loaded.step, 3);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (const auto& [step, loss] : resumed.losses) {
    EXPECT_EQ(reference.losses.at(step), loss) << "loss at step " << step;
  }
  for (const auto& [name, values] : reference.params) {
    EXPECT_EQ(values, resumed.params.at(name)) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, HybridQuantizedCheckpoint, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Stage" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace zest
