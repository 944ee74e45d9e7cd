// qgZ at 4 bits through zest-train: --print-config shows
// zero_optimization.zero_quantized_gradients_bits (8 by default), a value other than 8 or 4 exits
// 2 with one line naming the key, and a tiny GPT
// on 2 nodes x 2 ranks trains with int4 gradients, sending across nodes the int4 share of int8's
// gradient bytes (half the values, the same scales).
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/scratch_directory.h"
#include "tests/support/subprocess.h"
#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using zest::testing::kZestTrain;
using zest::testing::lines_of;
using zest::testing::ProcessResult;

const std::string kGptConfig = ZEST_SOURCE_DIR "/configs/default.json";
// A GPT small enough for a test (as tests/tools/zest_train_test.cc's), on 2 nodes x 2 ranks.
const std::vector<std::string> kTinyGpt = {
    "--set", "data.path=" ZEST_SOURCE_DIR "/configs/corpus/stories.txt", "--set",
    "model.n_layer=2", "--set", "model.n_head=2", "--set", "model.n_embd=32", "--set",
    "model.seq_len=32", "--set", "train_batch_size=8", "--set", "train_micro_batch_size_per_gpu=2",
    "--set", "scheduler={}", "--set", "world.ranks_per_node=2", "--set", "eval_every=0"};
const std::string kQgz = "zero_optimization.zero_quantized_gradients=true";
const std::string kBits = "zero_optimization.zero_quantized_gradients_bits=";

class ZestTrainInt4 : public zest::testing::ScratchDirectoryTest {
 protected:
  ProcessResult run(std::vector<std::string> args) const {
    args.insert(args.begin(), {"--config", kGptConfig});
    args.insert(args.end(), kTinyGpt.begin(), kTinyGpt.end());
    return zest::testing::run_program(kZestTrain, args, {path("stdout.txt"), path("stderr.txt")});
  }

  std::vector<json> steps(const std::string& name, const std::vector<std::string>& extra) const {
    const std::string metrics = path(name + ".jsonl");
    std::vector<std::string> args = {"--set", "steps=12", "--metrics", metrics};
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult result = run(args);
    EXPECT_EQ(result.status, 0) << result.err;
    return zest::testing::step_records(metrics);
  }
};

TEST_F(ZestTrainInt4, PrintConfigShowsTheGradientBits) {
  const ProcessResult plain = run({"--print-config"});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(json::parse(plain.out)["zero_optimization"]["zero_quantized_gradients_bits"], 8);
  const ProcessResult four = run({"--print-config", "--set", kQgz, "--set", kBits + "4"});
  ASSERT_EQ(four.status, 0) << four.err;
  const json resolved = json::parse(four.out);
  EXPECT_EQ(resolved["zero_optimization"]["zero_quantized_gradients_bits"], 4);
  EXPECT_EQ(resolved["zero_optimization"]["zero_quantized_gradients"], true);
}

TEST_F(ZestTrainInt4, BitsOtherThanEightOrFourExitTwoWithOneLineNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"3", "3"}, {"16", "16"}, {"\"4\"", "string \"4\""}};
  for (const auto& [value, shown] : cases) {
    SCOPED_TRACE(value);
    const std::string metrics = path("metrics.jsonl");
    const ProcessResult result =
        run({"--set", kQgz, "--set", kBits + value, "--metrics", metrics});
    EXPECT_EQ(result.status, 2) << result.err;
    const std::vector<std::string> lines = lines_of(result.err);
    ASSERT_EQ(lines.size(), 1u) << result.err;
    EXPECT_THAT(lines[0], ::testing::StartsWith("zest-train: error: "));
    EXPECT_THAT(lines[0], ::testing::EndsWith(
                              "zero_optimization.zero_quantized_gradients_bits: must be 8 or 4, "
                              "got " + shown));
    EXPECT_FALSE(std::filesystem::exists(metrics));
    EXPECT_FALSE(std::filesystem::exists(metrics + ".tmp"));
  }
}

// Per unit and step, a rank sends one packed node partial across nodes: int8 S + pad + 4 per 256
// values, int4 S/2 + pad + the same scales; over the tiny GPT's units the ratio is within 0.005 of
// (1/2 + 4/256) / (1 + 4/256) (the padding to 4 bytes of each unit's run moves it by less).
TEST_F(ZestTrainInt4, TinyGptTrainsSendingTheInt4ShareOfInt8sBytesAcrossNodes) {
  const std::vector<json> int8 = steps("int8", {"--set", kQgz});
  const std::vector<json> int4 = steps("int4", {"--set", kQgz, "--set", kBits + "4"});
  ASSERT_EQ(int8.size(), 12u);
  ASSERT_EQ(int4.size(), 12u);
  for (const json& record : int4) ASSERT_TRUE(record["loss"].is_number()) << record.dump();
  EXPECT_LT(int4.back()["loss"].get<double>(), 0.9 * int4.front()["loss"].get<double>());
  const double int8_sent = int8.back()["wire_bytes"]["send"][1].get<double>();
  const double int4_sent = int4.back()["wire_bytes"]["send"][1].get<double>();
  ASSERT_GT(int8_sent, 0.0);
  EXPECT_NEAR(int4_sent / int8_sent, (0.5 + 4.0 / 256) / (1.0 + 4.0 / 256), 0.005);
  // The gathers do not change: only the gradients' sends do.
  EXPECT_EQ(int8.back()["wire_bytes"]["all_gather"], int4.back()["wire_bytes"]["all_gather"]);
}

}  // namespace
