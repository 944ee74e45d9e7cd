// A checkpoint saved at one world size and stage resumes at another — resharded at load, or
// offline by reshard_checkpoint — and the continued run matches the uninterrupted one.
#include <cmath>
#include <cstring>
#include <tuple>

#include <gtest/gtest.h>

#include "base/dtype.h"
#include "base/error.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reshard.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

// 1e-6 relative, as in engine_parity_test: the runs differ only in the order fp32 sums are taken
// across ranks (about 1e-7 relative per step), which a few steps of Adam do not amplify past
// 1e-6 here; the absolute floor covers values that cross zero.
constexpr double kRelative = 1e-6;
constexpr double kAbsolute = 1e-7;

void expect_close_runs(const TrainResult& reference, const TrainResult& resumed) {
  for (const auto& [step, loss] : resumed.losses) {
    const float expected = reference.losses.at(step);
    EXPECT_NEAR(expected, loss, kRelative * std::abs(expected) + kAbsolute)
        << "loss at step " << step;
  }
  ASSERT_EQ(reference.params.size(), resumed.params.size());
  for (const auto& [name, values] : reference.params) {
    const std::vector<float>& other = resumed.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_NEAR(values[i], other[i], kRelative * std::abs(values[i]) + kAbsolute)
          << name << "[" << i << "]";
    }
  }
}

struct Change {
  int from_world, from_stage, to_world, to_stage;
};

class CheckpointReshard : public ::testing::TestWithParam<Change> {};

TEST_P(CheckpointReshard, ResumesAtAnotherWorldSizeAndStage) {
  const Change change = GetParam();
  ScratchDirectory scratch;
  TrainSpec reference_spec;
  reference_spec.world = change.to_world;
  reference_spec.stage = change.to_stage;
  const TrainResult reference = train_mlp(reference_spec);

  TrainSpec first;
  first.world = change.from_world;
  first.stage = change.from_stage;
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  train_mlp(first);

  TrainSpec second = reference_spec;
  second.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(second);
  EXPECT_TRUE(resumed.loaded.resharded);
  EXPECT_EQ(resumed.loaded.saved_world_size, change.from_world);
  EXPECT_EQ(resumed.loaded.saved_stage, change.from_stage);
  EXPECT_EQ(resumed.losses.size(), 3u);
  expect_close_runs(reference, resumed);
}

INSTANTIATE_TEST_SUITE_P(Changes, CheckpointReshard,
                         ::testing::Values(Change{4, 1, 2, 3}, Change{2, 3, 3, 1},
                                           Change{3, 0, 1, 2}, Change{1, 2, 4, 0}),
                         [](const auto& info) {
                           const Change& c = info.param;
                           return "world" + std::to_string(c.from_world) + "stage" +
                                  std::to_string(c.from_stage) + "_to_world" +
                                  std::to_string(c.to_world) + "stage" + std::to_string(c.to_stage);
                         });

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

TEST(CheckpointReshardOffline, LoadsExactlyLikeReshardingAtLoad) {
  ScratchDirectory scratch;
  TrainSpec first;
  first.world = 4;
  first.stage = 1;
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  train_mlp(first);

  const ReshardResult result =
      reshard_checkpoint(scratch.path("ckpt"), scratch.path("resharded"), 2, 3);
  EXPECT_EQ(result.world_size, 2);
  const CheckpointManifest manifest = read_manifest(scratch.path("resharded"));
  EXPECT_EQ(manifest.world_size, 2);
  EXPECT_EQ(manifest.stage, 3);
  EXPECT_EQ(manifest.step, 3);
  verify_checkpoint(scratch.path("resharded"));

  TrainSpec online;
  online.world = 2;
  online.stage = 3;
  online.resume = scratch.path("ckpt");
  TrainSpec offline = online;
  offline.resume = scratch.path("resharded");
  const TrainResult a = train_mlp(online);
  const TrainResult b = train_mlp(offline);
  EXPECT_TRUE(a.loaded.resharded);
  EXPECT_FALSE(b.loaded.resharded);
  for (const auto& [step, loss] : a.losses) EXPECT_TRUE(same_bits(loss, b.losses.at(step))) << step;
  for (const auto& [name, values] : a.params) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(same_bits(values[i], b.params.at(name)[i])) << name << "[" << i << "]";
    }
  }
}

TEST(CheckpointReshardOffline, RefusesAnExistingOutputAndBadSizes) {
  ScratchDirectory scratch;
  TrainSpec first;
  first.steps = 1;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 1;
  train_mlp(first);
  std::filesystem::create_directories(scratch.path("taken"));
  EXPECT_THROW(reshard_checkpoint(scratch.path("ckpt"), scratch.path("taken"), 2), Error);
  EXPECT_THROW(reshard_checkpoint(scratch.path("ckpt"), scratch.path("new"), 0), Error);
  EXPECT_THROW(reshard_checkpoint(scratch.path("ckpt"), scratch.path("new"), 2, 4), Error);
  EXPECT_FALSE(std::filesystem::exists(scratch.path("new")));
}

// An fp32 checkpoint resumed in bf16: the master weights are the saved fp32 parameters and the
// bf16 parameters their rounding; a bf16 checkpoint resumed in fp32 takes the master weights.
TEST(CheckpointDtypes, Fp32CheckpointSeedsBf16MasterAndBack) {
  ScratchDirectory scratch;
  TrainSpec fp32;
  fp32.world = 2;
  fp32.stage = 1;
  fp32.steps = 2;
  fp32.save_dir = scratch.path("fp32");
  fp32.save_at = 2;
  const TrainResult saved = train_mlp(fp32);

  TrainSpec bf16;
  bf16.world = 3;
  bf16.stage = 2;
  bf16.compute_dtype = DType::kBFloat16;
  bf16.steps = 2;  // load only
  bf16.resume = scratch.path("fp32");
  bf16.save_dir = scratch.path("bf16");
  bf16.save_at = 2;
  std::map<std::string, std::vector<float>> masters;
  bf16.at_start = [&](RankContext& context, Trainer& trainer) {
    // Rank 0's master shard of unit 0 must be the fp32 parameters exactly.
    if (context.rank != 0) return;
    for (const StateShard& shard : trainer.state_shards(0)) {
      if (shard.name != "master") continue;
      const float* master = static_cast<const float*>(shard.data);
      masters["layer0"].assign(master, master + (shard.end - shard.begin));
    }
  };
  const TrainResult loaded = train_mlp(bf16);
  const std::vector<float>& weight = saved.params.at("layer0.weight");
  const std::vector<float>& master = masters.at("layer0");
  for (std::size_t i = 0; i < std::min(weight.size(), master.size()); ++i) {
    ASSERT_TRUE(same_bits(weight[i], master[i])) << i;
  }
  for (const auto& [name, values] : saved.params) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const float rounded = static_cast<float>(BFloat16(values[i]));
      ASSERT_TRUE(same_bits(rounded, loaded.params.at(name)[i])) << name << "[" << i << "]";
    }
  }

  // And back: a bf16 checkpoint resumed in fp32 starts from the master weights, not the
  // rounded parameters.
  TrainSpec back = fp32;
  back.world = 1;
  back.stage = 0;
  back.resume = scratch.path("bf16");
  back.save_dir.clear();
  const TrainResult restored = train_mlp(back);
  for (const auto& [name, values] : saved.params) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(same_bits(values[i], restored.params.at(name)[i])) << name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace zest
