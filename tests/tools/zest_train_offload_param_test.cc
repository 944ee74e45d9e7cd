// Runs the built zest-train on configs/gpt_offload_param.json (stage 3, parameters and optimizer
// offloaded to the host, full recomputation, bf16): it trains, says where the parameters are,
// measures each rank's parameter shards in the host arena equal to the prediction, and its
// losses are the bits of the same config with both offloads off (on a device large enough).
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using zest::testing::ProcessResult;

const std::string kConfig = ZEST_SOURCE_DIR "/configs/gpt_offload_param.json";

class ZestTrainOffloadParam : public zest::testing::ScratchDirectoryTest {
 protected:
  ProcessResult train(const std::string& name, std::vector<std::string> extra) const {
    // The config's data path is relative to the source tree, as the README runs it.
    std::vector<std::string> args = {"--config", kConfig, "--metrics", path(name + ".jsonl"),
                                     "--set", "steps=6", "--set",
                                     "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt"};
    args.insert(args.end(), extra.begin(), extra.end());
    return zest::testing::run_program(zest::testing::kZestTrain, args,
                                      {path(name + ".out"), path(name + ".err")});
  }
};

TEST_F(ZestTrainOffloadParam, TrainsWithTheShardsInTheHostArenaAsWithoutOffload) {
  const ProcessResult offloaded = train("offloaded", {});
  ASSERT_EQ(offloaded.status, 0) << offloaded.err;
  EXPECT_THAT(offloaded.out, HasSubstr("parameters offloaded to cpu"));
  std::string host_line;
  for (const std::string& line : zest::testing::lines_of(offloaded.out)) {
    if (line.find("host params") != std::string::npos) host_line = line;
  }
  ASSERT_FALSE(host_line.empty()) << offloaded.out;
  // Each rank's measured bytes, then its prediction: "rank 0 X (predicted X)".
  for (const std::string rank : {"rank 0 ", "rank 1 "}) {
    const std::size_t at = host_line.find(rank);
    ASSERT_NE(at, std::string::npos) << host_line;
    const std::size_t open = host_line.find(" (predicted ", at);
    const std::string measured = host_line.substr(at + rank.size(), open - at - rank.size());
    const std::size_t close = host_line.find(')', open);
    const std::size_t value = open + std::string(" (predicted ").size();
    EXPECT_EQ(measured, host_line.substr(value, close - value)) << host_line;
    EXPECT_NE(measured, "0 B") << host_line;
  }
  const ProcessResult plain =
      train("plain", {"--set", "zero_optimization.offload_param={\"device\": \"none\"}", "--set",
                      "zero_optimization.offload_optimizer={\"device\": \"none\"}", "--set",
                      "world.device_memory=\"1GiB\""});
  ASSERT_EQ(plain.status, 0) << plain.err;
  const std::vector<json> with = zest::testing::step_records(path("offloaded.jsonl"));
  const std::vector<json> without = zest::testing::step_records(path("plain.jsonl"));
  ASSERT_EQ(with.size(), 6u);
  ASSERT_EQ(without.size(), 6u);
  for (std::size_t step = 0; step < with.size(); ++step) {
    EXPECT_EQ(with[step]["loss"], without[step]["loss"]) << step;
  }
}

TEST_F(ZestTrainOffloadParam, StageTwoIsOneLineAndStatusTwo) {
  const ProcessResult result = train("stage2", {"--set", "zero_optimization.stage=2"});
  EXPECT_EQ(result.status, 2);
  EXPECT_EQ(zest::testing::lines_of(result.err).size(), 1u) << result.err;
  EXPECT_THAT(result.err, ::testing::StartsWith("zest-train: error: "));
  EXPECT_THAT(result.err, HasSubstr("zero_optimization.offload_param.device: offloading "
                                    "parameters needs zero_optimization.stage 3 (got 2)"));
}

}  // namespace
