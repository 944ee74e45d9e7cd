// zest-train with hybrid sharding (zero_optimization.hybrid_shard_size), ranks as threads: a
// checkpoint saved in shard groups holds one group's files, resumes in the same groups to the bit
// and without them or in other groups within rounding; zest-ckpt inspects and reshards it; a
// manifest whose hybrid keys disagree with its files, or a missing shard, is one line, exit 2.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using zest::testing::lines_of;
using zest::testing::ProcessResult;
using zest::testing::StepLoss;

const std::string kCkpt = ZEST_BINARY_DIR "/bin/zest-ckpt";
// The default job (4 ranks, stage 3, fp32) made small, as tests/tools/zest_train_pipeline_test.cc.
const std::vector<std::string> kOverrides = {
    "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt",
    "model.n_layer=2", "model.n_head=2", "model.n_embd=64", "steps=4", "scheduler={}",
    "eval_every=0", "train_micro_batch_size_per_gpu=4"};
const std::string kHybrid = "zero_optimization.hybrid_shard_size=2";

class ZestTrainHybridCheckpoint : public zest::testing::ZestTrainJobTest {
 protected:
  ZestTrainHybridCheckpoint() : ZestTrainJobTest(kOverrides) {}

  void expect_input_error(const ProcessResult& result, const std::string& program,
                          const std::vector<std::string>& expected) const {
    EXPECT_EQ(result.status, 2) << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], StartsWith(program + ": error: "));
    for (const std::string& part : expected) EXPECT_THAT(lines[0], HasSubstr(part));
  }

  // Saves the hybrid run at step 2 into ckpt/; returns the step directory.
  std::string save_at_step_two() const {
    const std::vector<StepLoss> saved =
        steps_of({kHybrid, "steps=2", "checkpoint.dir=" + path("ckpt"),
                  "checkpoint.every_steps=2"});
    EXPECT_EQ(saved.size(), 2u);
    return path("ckpt") + "/step-2";
  }
};

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

void expect_close(const std::vector<StepLoss>& steps, const std::vector<StepLoss>& reference,
                  const std::string& what) {
  ASSERT_EQ(steps.size(), 2u) << what;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    // fp32, the same state summed in another order; the metrics print 8 significant digits.
    EXPECT_NEAR(steps[i].loss, reference[i + 2].loss, 1e-5 * reference[i + 2].loss)
        << what << ", step " << i + 3;
    EXPECT_NEAR(steps[i].grad_norm, reference[i + 2].grad_norm, 1e-5 * reference[i + 2].grad_norm)
        << what << ", step " << i + 3;
  }
}

TEST_F(ZestTrainHybridCheckpoint, ResumesInTheSameShardGroupsToTheBitAndElsewhereWithinRounding) {
  const std::vector<StepLoss> uninterrupted = steps_of({kHybrid});
  ASSERT_EQ(uninterrupted.size(), 4u);
  const std::string step = save_at_step_two();
  EXPECT_EQ(names_in(step), (std::set<std::string>{"manifest.json", "rank-0.bin", "rank-1.bin"}));

  // The same shard groups (2 groups of 2): steps 3 and 4 to the bit.
  std::string out;
  const std::vector<StepLoss> resumed = steps_of(
      {kHybrid, "checkpoint.dir=" + path("ckpt"), R"(checkpoint.resume="auto")"}, {}, &out);
  ASSERT_EQ(resumed.size(), 2u);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].loss, uninterrupted[i + 2].loss) << "step " << i + 3;
    EXPECT_EQ(resumed[i].grad_norm, uninterrupted[i + 2].grad_norm) << "step " << i + 3;
  }
  EXPECT_THAT(out, HasSubstr("at step 2 (saved by 4 ranks in 2 shard groups of 2 at stage 3)"));

  // (From step 2 by its path: the resumed run above saved step 4 on exit.)
  const std::string from = "checkpoint.resume=\"" + step + "\"";
  expect_close(steps_of({from}), uninterrupted, "plain ZeRO over 4 ranks");
  expect_close(steps_of({from, "zero_optimization.hybrid_shard_size=1"}), uninterrupted,
               "4 shard groups of 1");
  expect_close(steps_of({from, kHybrid, "zero_optimization.stage=1"}), uninterrupted,
               "2 shard groups of 2 at ZeRO 1");
}

TEST_F(ZestTrainHybridCheckpoint, ZestCkptInspectsAndReshardsIt) {
  const std::string step = save_at_step_two();
  const ProcessResult inspect = zest::testing::run_program(
      kCkpt, {"inspect", step}, {path("stdout.txt"), path("stderr.txt")});
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  EXPECT_THAT(inspect.out, HasSubstr("world size 2, stage 3"));
  EXPECT_THAT(inspect.out, HasSubstr("hybrid sharding: saved by 2 shard groups of 2 ranks (4 "
                                     "ranks); the files are one group's"));
  const ProcessResult reshard = zest::testing::run_program(
      kCkpt, {"reshard", step, "--world", "4", "--out", path("four")},
      {path("stdout.txt"), path("stderr.txt")});
  ASSERT_EQ(reshard.status, 0) << reshard.err;
  EXPECT_EQ(names_in(path("four")), (std::set<std::string>{"manifest.json", "rank-0.bin",
                                                           "rank-1.bin", "rank-2.bin",
                                                           "rank-3.bin"}));
  const ProcessResult plain = zest::testing::run_program(
      kCkpt, {"inspect", path("four")}, {path("stdout.txt"), path("stderr.txt")});
  EXPECT_THAT(plain.out, ::testing::Not(HasSubstr("hybrid")));
  // The resharded checkpoint resumes the hybrid run (cut anew into its shard groups' shards).
  const std::vector<StepLoss> uninterrupted = steps_of({kHybrid});
  expect_close(steps_of({kHybrid, "checkpoint.resume=\"" + path("four") + "\""}), uninterrupted,
               "resharded to 4, resumed in 2 shard groups of 2");
}

TEST_F(ZestTrainHybridCheckpoint, AManifestThatDisagreesOrAMissingShardIsOneLine) {
  const std::string step = save_at_step_two();
  const std::string resume = "checkpoint.resume=\"" + step + "\"";
  const std::string manifest_path = step + "/manifest.json";
  std::string text;
  {
    std::ifstream in(manifest_path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Edited (so without its checksum line, as an older zest's): the shard size says 4 files.
  json manifest = json::parse(text);
  manifest["hybrid_shard_size"] = 4;
  std::ofstream(manifest_path, std::ios::trunc) << manifest.dump();
  expect_input_error(train({kHybrid, resume}), "zest-train",
                     {"manifest.json: hybrid_shard_size is 4 but world_size is 2",
                      "resume from another checkpoint"});
  std::ofstream(manifest_path, std::ios::trunc) << text;

  fs::remove(step + "/rank-1.bin");
  expect_input_error(train({kHybrid, resume}), "zest-train",
                     {"rank-1.bin: missing (the manifest lists it)",
                      "restore the file or resume from another checkpoint"});
}

// Inside pipeline stages (2 stages x 2 data-parallel ranks in groups of 1): the same numbers as
// the pipeline without hybrid sharding, and a checkpoint resumed to the bit.
TEST_F(ZestTrainHybridCheckpoint, InsidePipelineStagesTrainsAndResumes) {
  const std::string pipeline = R"(pipeline={"stages": 2})";
  const std::string groups_of_one = "zero_optimization.hybrid_shard_size=1";
  const std::vector<StepLoss> plain = steps_of({pipeline});
  const std::vector<StepLoss> hybrid = steps_of({pipeline, groups_of_one});
  ASSERT_EQ(hybrid.size(), 4u);
  ASSERT_EQ(plain.size(), 4u);
  for (std::size_t i = 0; i < hybrid.size(); ++i) {
    EXPECT_NEAR(hybrid[i].loss, plain[i].loss, 1e-5 * plain[i].loss) << "step " << i + 1;
    EXPECT_NEAR(hybrid[i].grad_norm, plain[i].grad_norm, 1e-5 * plain[i].grad_norm)
        << "step " << i + 1;
  }
  ASSERT_EQ(steps_of({pipeline, groups_of_one, "steps=2", "checkpoint.dir=" + path("ckpt"),
                      "checkpoint.every_steps=2"})
                .size(),
            2u);
  EXPECT_EQ(names_in(path("ckpt") + "/step-2"),
            (std::set<std::string>{"manifest.json", "rank-0.bin", "rank-1.bin"}));
  std::string out;
  const std::vector<StepLoss> resumed = steps_of(
      {pipeline, groups_of_one, "checkpoint.resume=\"" + path("ckpt") + "\""}, {}, &out);
  ASSERT_EQ(resumed.size(), 2u);
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(resumed[i].loss, hybrid[i + 2].loss) << "step " << i + 3;
    EXPECT_EQ(resumed[i].grad_norm, hybrid[i + 2].grad_norm) << "step " << i + 3;
  }
  EXPECT_THAT(out, HasSubstr("(saved by 4 ranks in 2 shard groups of 1 at stage 3)"));
}

}  // namespace
