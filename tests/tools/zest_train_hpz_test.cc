// zest-train with hpZ (zero_optimization.zero_hpz_partition_size), judged by the built tool: on
// 2 nodes x 2 ranks every step's loss is plain stage 3's to the bit, the gathers put fewer bytes
// across nodes (backward's stay inside the node) and the reduce-scatters as many; a size that does
// not fit a node is one line and exit status 2.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using zest::testing::ProcessResult;

const std::string& kTrain = zest::testing::kZestTrain;
const std::string kConfig = ZEST_SOURCE_DIR "/configs/mlp.json";

class ZestTrainHpz : public zest::testing::ScratchDirectoryTest {
 protected:
  // The step records of a 3-step MLP run at stage 3 on 2 nodes x 2 ranks. Five layers of one
  // size: a size class of five units and two slots, so backward gathers most units again.
  std::vector<json> steps(const std::vector<std::string>& extra, const std::string& name) const {
    std::vector<std::string> args = {"--config", kConfig, "--set", "steps=3", "--set",
                                     "model.sizes=[64,128,128,128,128,128,10]", "--set",
                                     "world.ranks_per_node=2", "--set", "world.link.model=\"off\"",
                                     "--metrics", path(name + ".jsonl")};
    args.insert(args.end(), extra.begin(), extra.end());
    return zest::testing::train_steps(args, path(name + ".jsonl"),
                                      {path("stdout.txt"), path("stderr.txt")});
  }
};

TEST_F(ZestTrainHpz, TrainsAsPlainStage3WithFewerGatheredBytesAcrossNodes) {
  const std::vector<json> plain = steps({}, "plain");
  const std::vector<json> hpz =
      steps({"--set", "zero_optimization.zero_hpz_partition_size=2"}, "hpz");
  ASSERT_EQ(plain.size(), 3u);
  ASSERT_EQ(hpz.size(), 3u);
  for (std::size_t s = 0; s < plain.size(); ++s) {
    EXPECT_EQ(plain[s]["loss"], hpz[s]["loss"]) << s;
    const json& gathers = hpz[s]["wire_bytes"]["all_gather"];
    const json& plain_gathers = plain[s]["wire_bytes"]["all_gather"];
    // [intra, inter]: the forward's gathers cross as before, backward's stay in the node.
    EXPECT_LT(gathers[1].get<double>(), plain_gathers[1].get<double>()) << hpz[s].dump();
    EXPECT_GT(gathers[0].get<double>(), plain_gathers[0].get<double>()) << hpz[s].dump();
    EXPECT_EQ(hpz[s]["wire_bytes"]["reduce_scatter"], plain[s]["wire_bytes"]["reduce_scatter"]);
  }
}

TEST_F(ZestTrainHpz, ASizeThatDoesNotFitANodeIsOneLineAndStatus2) {
  const ProcessResult result = zest::testing::run_program(
      kTrain,
      {"--config", kConfig, "--set", "steps=1", "--set", "world.ranks_per_node=2", "--set",
       "zero_optimization.zero_hpz_partition_size=4"},
      {path("stdout.txt"), path("stderr.txt")});
  EXPECT_EQ(result.status, 2);
  EXPECT_EQ(result.err,
            "zest-train: error: " + kConfig +
                ": zero_optimization.zero_hpz_partition_size: 4 does not divide the 2 "
            "ranks of a node (world.ranks_per_node 2, world.ranks 4); a secondary shard's "
            "group lies inside one node\n");
}

}  // namespace
