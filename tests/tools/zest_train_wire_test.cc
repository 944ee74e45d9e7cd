// zest-train's bytes on the wire, judged by the built tool: every step's metrics record carries
// rank 0's bytes inside its node and across nodes, and each collective kind's; with hybrid
// sharding on 2 nodes x 2 ranks no gather crosses nodes; the run report shows them in a table.
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
using zest::testing::read_file;

const std::string kConfig = ZEST_SOURCE_DIR "/configs/mlp.json";

class ZestTrainWire : public zest::testing::ScratchDirectoryTest {
 protected:
  // The step records of a 3-step MLP run at stage 3 on 2 nodes x 2 ranks.
  std::vector<json> steps(const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {"--config", kConfig, "--set", "steps=3", "--set",
                                     "world.ranks_per_node=2", "--metrics", path("run.jsonl"),
                                     "--report", path("run.html")};
    args.insert(args.end(), extra.begin(), extra.end());
    return zest::testing::train_steps(args, path("run.jsonl"),
                                      {path("stdout.txt"), path("stderr.txt")});
  }
};

TEST_F(ZestTrainWire, EveryStepRecordsItsBytesInsideAndAcrossNodes) {
  const std::vector<json> plain = steps({});
  ASSERT_EQ(plain.size(), 3u);
  for (const json& step : plain) {
    EXPECT_GT(step["intra_node_bytes"].get<double>(), 0.0) << step.dump();
    EXPECT_GT(step["inter_node_bytes"].get<double>(), 0.0) << step.dump();
    // A ring over 4 ranks on 2 nodes: half of each gather crosses.
    const json& gathers = step["wire_bytes"]["all_gather"];
    EXPECT_EQ(gathers[0], gathers[1]) << step.dump();
    // The same work every step, so the same bytes.
    EXPECT_EQ(step["wire_bytes"], plain[0]["wire_bytes"]);
  }
  EXPECT_THAT(read_file(path("run.html")), HasSubstr("Bytes on the wire"));

  const std::vector<json> hybrid = steps({"--set", "zero_optimization.hybrid_shard_size=\"node\""});
  ASSERT_EQ(hybrid.size(), 3u);
  for (const json& step : hybrid) {
    EXPECT_EQ(step["wire_bytes"]["all_gather"][1], 0) << step.dump();
    EXPECT_EQ(step["wire_bytes"]["reduce_scatter"][1], 0) << step.dump();
    EXPECT_LT(step["inter_node_bytes"].get<double>(), plain[0]["inter_node_bytes"].get<double>());
  }
}

}  // namespace
