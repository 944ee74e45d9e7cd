// Checkpoints of a hybrid-sharded run (zero_optimization.hybrid_shard_size): every shard group
// holds the same state, so the first group's ranks write it once — a checkpoint of the shard
// group's size plus hybrid_shard_size and hybrid_replicas — and the others only hash theirs to
// prove it. Resumed at the same hybrid layout the run continues bit for bit; at another shard
// size, as plain ZeRO, at another world or after zest-ckpt reshard, within the reshard tolerance;
// a manifest whose hybrid keys disagree with its files, a missing shard and replicas that drifted
// apart are one line each, and nothing is half-written. Ranks are threads.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "checkpoint/manifest.h"
#include "checkpoint/reshard.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

// As tests/checkpoint/reshard_test.cc: the runs differ only in the order fp32 sums are taken
// across ranks (a shard group's mean, then the replicas', against one mean), about 1e-7 relative
// per step, which a few steps of AdamW do not amplify past 1e-6; the floor covers zero crossings.
constexpr double kRelative = 1e-6;
constexpr double kAbsolute = 1e-7;

// A run of `world` ranks in shard groups of `shard_size` (0: plain ZeRO).
TrainSpec hybrid_spec(int world, int shard_size, int stage) {
  TrainSpec spec;
  spec.world = world;
  spec.stage = stage;
  spec.configure_engine = [shard_size](EngineOptions& engine) {
    engine.hybrid_shard_size = shard_size;
  };
  return spec;
}

void expect_bit_identical(const TrainResult& reference, const TrainResult& resumed) {
  ASSERT_FALSE(resumed.losses.empty());
  for (const auto& [step, loss] : resumed.losses) {
    EXPECT_EQ(reference.losses.at(step), loss) << "loss at step " << step;
  }
  ASSERT_EQ(reference.params.size(), resumed.params.size());
  for (const auto& [name, values] : reference.params) {
    EXPECT_EQ(values, resumed.params.at(name)) << name;
  }
}

void expect_close(const TrainResult& reference, const TrainResult& resumed) {
  ASSERT_FALSE(resumed.losses.empty());
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

// Saves `spec`'s run after 3 of its 6 steps into `dir`.
void save_half_way(TrainSpec spec, const std::string& dir) {
  spec.steps = 3;
  spec.save_dir = dir;
  spec.save_at = 3;
  train_mlp(spec);
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

class HybridCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(HybridCheckpoint, OneShardGroupSavesAndTheSameLayoutResumesBitIdentically) {
  ScratchDirectory scratch;
  const TrainSpec spec = hybrid_spec(4, 2, GetParam());
  const TrainResult reference = train_mlp(spec);
  save_half_way(spec, scratch.path("ckpt"));

  const std::string step = scratch.path("ckpt") + "/step-3";
  const CheckpointManifest manifest = read_manifest(step);
  EXPECT_EQ(manifest.world_size, 2);
  EXPECT_EQ(manifest.hybrid_replicas, 2);
  EXPECT_EQ(manifest.pipeline_stages, 1);
  EXPECT_EQ(manifest.files.size(), 2u);
  EXPECT_EQ(names_in(step), (std::set<std::string>{"manifest.json", "rank-0.bin", "rank-1.bin"}));
  const std::string text = testing::read_whole_file(step + "/manifest.json");
  EXPECT_THAT(text, HasSubstr("\"hybrid_shard_size\": 2,\n  \"hybrid_replicas\": 2,"));
  verify_checkpoint(scratch.path("ckpt"));

  TrainSpec resume = spec;
  resume.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(resume);
  EXPECT_EQ(resumed.loaded.step, 3);
  EXPECT_EQ(resumed.loaded.saved_world_size, 2);
  EXPECT_EQ(resumed.loaded.saved_replicas, 2);
  EXPECT_FALSE(resumed.loaded.resharded);
  EXPECT_EQ(resumed.losses.size(), 3u);
  expect_bit_identical(reference, resumed);
}

INSTANTIATE_TEST_SUITE_P(Stages, HybridCheckpoint, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Stage" + std::to_string(info.param);
                         });

struct Layout {
  int world, shard_size, stage;
};

class HybridCheckpointLayouts : public ::testing::TestWithParam<Layout> {};

// Saved by 4 ranks in shard groups of 2 at ZeRO 2; resumed at another layout, against that
// layout's uninterrupted run.
TEST_P(HybridCheckpointLayouts, ResumeWithinTheReshardTolerance) {
  const Layout to = GetParam();
  ScratchDirectory scratch;
  save_half_way(hybrid_spec(4, 2, 2), scratch.path("ckpt"));
  const TrainSpec spec = hybrid_spec(to.world, to.shard_size, to.stage);
  const TrainResult reference = train_mlp(spec);
  TrainSpec resume = spec;
  resume.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(resume);
  EXPECT_EQ(resumed.loaded.saved_replicas, 2);
  EXPECT_EQ(resumed.losses.size(), 3u);
  expect_close(reference, resumed);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HybridCheckpointLayouts,
    ::testing::Values(Layout{4, 1, 3},   // four groups of one rank
                      Layout{4, 0, 2},   // plain ZeRO over the same world
                      Layout{2, 0, 1},   // a world of the shard group's size
                      Layout{6, 3, 3},   // another world, other groups
                      Layout{3, 0, 0}),  // DDP over three ranks
    [](const ::testing::TestParamInfo<Layout>& info) {
      return "World" + std::to_string(info.param.world) + "Shard" +
             std::to_string(info.param.shard_size) + "Stage" + std::to_string(info.param.stage);
    });

TEST(HybridCheckpointFrom, APlainCheckpointResumesAHybridRun) {
  ScratchDirectory scratch;
  save_half_way(hybrid_spec(4, 0, 2), scratch.path("ckpt"));
  const TrainSpec spec = hybrid_spec(4, 2, 2);
  const TrainResult reference = train_mlp(spec);
  TrainSpec resume = spec;
  resume.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(resume);
  EXPECT_EQ(resumed.loaded.saved_replicas, 1);
  EXPECT_TRUE(resumed.loaded.resharded);
  expect_close(reference, resumed);
}

TEST(HybridCheckpointReshard, ReshardWritesAPlainCheckpointThatResumes) {
  ScratchDirectory scratch;
  save_half_way(hybrid_spec(4, 2, 3), scratch.path("ckpt"));
  reshard_checkpoint(scratch.path("ckpt"), scratch.path("three"), 3);
  const CheckpointManifest manifest = read_manifest(scratch.path("three"));
  EXPECT_EQ(manifest.world_size, 3);
  EXPECT_EQ(manifest.hybrid_replicas, 1);
  EXPECT_THAT(testing::read_whole_file(scratch.path("three") + "/manifest.json"),
              ::testing::Not(HasSubstr("hybrid")));
  const TrainSpec spec = hybrid_spec(3, 0, 3);
  const TrainResult reference = train_mlp(spec);
  TrainSpec resume = spec;
  resume.resume = scratch.path("three");
  expect_close(reference, train_mlp(resume));
}

// Runs `run` and returns the Error it throws (failing the test if none).
Error error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "no Error thrown";
  return Error(ErrorKind::kInternal, "");
}

class HybridCheckpointBadInput : public ::testing::Test {
 protected:
  void SetUp() override { save_half_way(hybrid_spec(4, 2, 1), root()); }
  std::string root() const { return scratch_.path("ckpt"); }
  std::string step_dir() const { return root() + "/step-3"; }

  Error load_error() const {
    TrainSpec spec = hybrid_spec(4, 2, 1);
    spec.steps = 0;
    spec.resume = root();
    return error_of([&] { train_mlp(spec); });
  }
  // Edits the saved manifest (dropping its checksum line, as an older zest's), returns the error
  // reading it throws and puts the manifest back.
  Error edited_manifest_error(const std::function<void(nlohmann::json&)>& edit) const {
    const std::string path = step_dir() + "/manifest.json";
    const std::string saved = testing::read_whole_file(path);
    auto manifest = nlohmann::json::parse(saved);
    edit(manifest);
    testing::write_whole_file(path, manifest.dump());
    const Error error = error_of([&] { read_manifest(step_dir()); });
    testing::write_whole_file(path, saved);
    EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint) << error.what();
    return error;
  }

  ScratchDirectory scratch_;
};

TEST_F(HybridCheckpointBadInput, HybridKeysThatDisagreeWithTheFilesNameTheKey) {
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) { m["hybrid_shard_size"] = 4; }).what(),
              HasSubstr("manifest.json: hybrid_shard_size is 4 but world_size is 2: a hybrid "
                        "run's checkpoint holds one shard group's files"));
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) { m.erase("hybrid_replicas"); }).what(),
              HasSubstr("manifest.json: hybrid_replicas is missing"));
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) { m["hybrid_replicas"] = 1; }).what(),
              HasSubstr("manifest.json: hybrid_replicas is 1, outside [2, "));
  // Every replica's files listed, as if each shard group had written its own.
  EXPECT_THAT(edited_manifest_error([](nlohmann::json& m) {
                for (int r = 2; r < 4; ++r) {
                  nlohmann::json file = m["files"][0];
                  file["name"] = rank_file_name(r);
                  m["files"].push_back(file);
                }
              }).what(),
              HasSubstr("manifest.json: files lists 4 files, but a hybrid run's checkpoint holds "
                        "one shard group's: world_size 2 × pipeline_stages 1 = 2 (of 2 replicas)"));
}

TEST_F(HybridCheckpointBadInput, AMissingShardIsNamedOnLoadAndVerify) {
  fs::remove(step_dir() + "/rank-1.bin");
  const Error error = load_error();
  EXPECT_EQ(error.kind(), ErrorKind::kCheckpoint);
  EXPECT_THAT(error.what(), HasSubstr("rank-1.bin: missing (the manifest lists it)"));
  EXPECT_THAT(error.what(), HasSubstr("resume from another checkpoint"));
  EXPECT_THAT(error_of([&] { verify_checkpoint(root()); }).what(), HasSubstr("rank-1.bin"));
}

// A replica whose state drifted from its twin's (here: one parameter changed on rank 3 only)
// fails the save on every rank, naming both ranks; the previous checkpoint and `latest` stay.
TEST_F(HybridCheckpointBadInput, ReplicasThatDisagreeAreNotSaved) {
  TrainSpec spec = hybrid_spec(4, 2, 1);
  spec.resume = root();
  spec.steps = 4;
  spec.save_dir = root();
  spec.save_at = 4;
  spec.at_start = [](RankContext& context, Trainer& trainer) {
    if (context.rank != 3) return;
    const StateShard params = trainer.state_shards(0).front();
    static_cast<float*>(params.data)[0] += 1.0f;
  };
  const Error error = error_of([&] { train_mlp(spec); });
  EXPECT_EQ(error.kind(), ErrorKind::kInternal);
  EXPECT_THAT(error.what(), HasSubstr("hybrid sharding's replicas disagree: rank 3 holds another "
                                      "state than rank 1 for the same shard"));
  EXPECT_EQ(names_in(root()), (std::set<std::string>{"latest", "step-3"}));
  EXPECT_EQ(testing::read_whole_file(root() + "/latest"), "step-3\n");
}

// A save that fails on the writing group's rank 1 (disk full) fails on every rank, and leaves
// the previous checkpoint and `latest` as they were.
TEST_F(HybridCheckpointBadInput, AFailedSaveLeavesThePreviousCheckpoint) {
  TrainSpec spec = hybrid_spec(4, 2, 1);
  spec.resume = root();
  spec.steps = 4;
  spec.save_dir = root();
  spec.save_at = 4;
  spec.save_options.fail_after_bytes = 100;
  spec.save_options.fail_rank = 1;
  const Error error = error_of([&] { train_mlp(spec); });
  EXPECT_THAT(error.what(), HasSubstr("rank-1.bin"));
  EXPECT_EQ(names_in(root()), (std::set<std::string>{"latest", "step-3"}));
  verify_checkpoint(root());
}

}  // namespace
}  // namespace zest
