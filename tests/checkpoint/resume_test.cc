// A run saved after step 3 and resumed by a new world and trainer is the uninterrupted run:
// same per-step losses and same final parameters, bit for bit, at every stage and world size,
// in fp32, bf16 (master weights) and fp16 (loss scaler state), with AdamW and SGD.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>

#include <gtest/gtest.h>

#include "checkpoint/manifest.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Bit-identical: the resumed run does the same arithmetic in the same order on the same data.
void expect_identical(const TrainResult& reference, const TrainResult& resumed, std::int64_t from) {
  for (const auto& [step, loss] : resumed.losses) {
    ASSERT_GE(step, from);
    EXPECT_TRUE(same_bits(reference.losses.at(step), loss))
        << "step " << step << ": " << reference.losses.at(step) << " vs " << loss;
  }
  EXPECT_EQ(resumed.losses.size(), reference.losses.size() - static_cast<std::size_t>(from));
  ASSERT_EQ(reference.params.size(), resumed.params.size());
  for (const auto& [name, values] : reference.params) {
    const std::vector<float>& other = resumed.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      ASSERT_TRUE(same_bits(values[i], other[i]))
          << name << "[" << i << "]: " << values[i] << " vs " << other[i];
    }
  }
}

void check_resume(const TrainSpec& base) {
  ScratchDirectory scratch;
  const TrainResult reference = train_mlp(base);

  TrainSpec first = base;
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  const TrainResult saved = train_mlp(first);
  EXPECT_EQ(saved.saved.step, 3);
  EXPECT_EQ(saved.saved.path, scratch.path("ckpt") + "/step-3");

  TrainSpec second = base;
  second.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(second);
  EXPECT_EQ(resumed.loaded.step, 3);
  EXPECT_FALSE(resumed.loaded.resharded);
  EXPECT_EQ(resumed.loaded.extra.at("next_batch"), 3);
  for (std::int64_t step = 0; step < 3; ++step) {
    EXPECT_TRUE(same_bits(reference.losses.at(step), saved.losses.at(step))) << step;
  }
  expect_identical(reference, resumed, 3);
}

class CheckpointResume : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(CheckpointResume, ResumedRunIsBitIdenticalToUninterruptedRun) {
  TrainSpec spec;
  std::tie(spec.stage, spec.world) = GetParam();
  check_resume(spec);
}

INSTANTIATE_TEST_SUITE_P(StagesAndWorlds, CheckpointResume,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 4)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_world" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(CheckpointResumeMixed, Bf16WithMasterWeightsResumesBitIdentically) {
  TrainSpec spec;
  spec.stage = 2;
  spec.world = 2;
  spec.compute_dtype = DType::kBFloat16;
  check_resume(spec);
}

TEST(CheckpointResumeMixed, Fp16LossScalerStateResumesBitIdentically) {
  TrainSpec spec;
  spec.stage = 3;
  spec.world = 2;
  spec.compute_dtype = DType::kFloat16;
  spec.loss_scale.enabled = true;
  spec.loss_scale.initial_scale_power = 8;
  spec.loss_scale.loss_scale_window = 2;  // the scale changes within the 6 steps
  check_resume(spec);
}

TEST(CheckpointResumeMixed, SgdMomentumResumesBitIdentically) {
  TrainSpec spec;
  spec.stage = 1;
  spec.world = 2;
  spec.optimizer = "SGD";
  check_resume(spec);
}

TEST(CheckpointLayout, ManifestDescribesTheRunAndEveryRankFile) {
  ScratchDirectory scratch;
  TrainSpec spec;
  spec.stage = 2;
  spec.world = 4;
  spec.compute_dtype = DType::kBFloat16;
  spec.steps = 2;
  spec.save_dir = scratch.path("ckpt");
  spec.save_at = 2;
  train_mlp(spec);
  const std::string dir = scratch.path("ckpt") + "/step-2";
  EXPECT_EQ(testing::read_whole_file(scratch.path("ckpt") + "/latest"), "step-2\n");
  const CheckpointManifest m = read_manifest(dir);
  EXPECT_EQ(m.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(m.step, 2);
  EXPECT_EQ(m.world_size, 4);
  EXPECT_EQ(m.stage, 2);
  EXPECT_EQ(m.compute_dtype, DType::kBFloat16);
  EXPECT_EQ(m.counters.optimizer_steps, 2);
  EXPECT_EQ(m.config.at("zero_optimization").at("stage"), 2);
  ASSERT_EQ(m.tensors.size(), 4u);  // params, master, optimizer.0, optimizer.1
  EXPECT_EQ(m.tensors[0].name, "params");
  EXPECT_EQ(m.tensors[0].dtype, DType::kBFloat16);
  EXPECT_EQ(m.tensors[1].name, "master");
  EXPECT_EQ(m.tensors[2].name, "optimizer.0");
  ASSERT_EQ(m.units.size(), 3u);
  EXPECT_EQ(m.units[0].name, "layer0");
  EXPECT_EQ(m.units[0].numel, 13u * 31u + 31u);
  EXPECT_EQ(m.units[0].flat_length, m.units[0].shard_length * 4);
  ASSERT_EQ(m.files.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const auto size = std::filesystem::file_size(dir + "/" + rank_file_name(r));
    EXPECT_EQ(size, m.files[static_cast<std::size_t>(r)].bytes);
    EXPECT_EQ(size, m.rank_file_bytes());
  }
  // Nothing temporary is left beside the checkpoint.
  for (const auto& entry : std::filesystem::directory_iterator(scratch.path("ckpt"))) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(name == "latest" || name == "step-2") << name;
  }
}

TEST(CheckpointLayout, KeepLastRemovesOlderStepsAfterTheNewOneIsInPlace) {
  ScratchDirectory scratch;
  for (std::int64_t at = 1; at <= 4; ++at) {
    TrainSpec spec;
    spec.world = 2;
    spec.steps = at;
    spec.save_dir = scratch.path("ckpt");
    spec.save_at = at;
    spec.save_options.keep_last = 2;
    if (at > 1) spec.resume = scratch.path("ckpt");
    train_mlp(spec);
  }
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(scratch.path("ckpt"))) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-3", "step-4"}));
}

TEST(CheckpointLayout, SavingTheSameStepAgainReplacesItWhole) {
  ScratchDirectory scratch;
  TrainSpec spec;
  spec.world = 2;
  spec.steps = 2;
  spec.save_dir = scratch.path("ckpt");
  spec.save_at = 2;
  train_mlp(spec);
  spec.stage = 3;  // a second save of step 2, from another stage
  train_mlp(spec);
  EXPECT_EQ(read_manifest(scratch.path("ckpt") + "/step-2").stage, 3);
  verify_checkpoint(scratch.path("ckpt"));
}

}  // namespace
}  // namespace zest
