// ctest-labels: slow
// ZeRO++'s options together through zest-train on the default GPT (configs/default.json, the
// text corpus, 4 ranks on 2 nodes): ZeRO++ as DeepSpeed runs it (stage 3 + qwZ + hpZ of a node +
// qgZ) against ZeRO-3, and hybrid + qgZ against hybrid sharding: the loss curve stays within
// the stated tolerance at equal tokens, and the bytes across nodes per step fall as the wire
// formats say; hybrid + qgZ at 4 bits sends about half of 8 bits' across nodes and learns.
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using zest::testing::mean_loss;

constexpr int kSteps = 40;

class ZestTrainZeroPlusPlus : public zest::testing::DefaultGptOnTwoNodesTest {
 protected:
  std::vector<json> steps(const std::string& name, std::vector<std::string> extra) const {
    extra.insert(extra.begin(), {"--set", "world.link.model=\"off\""});
    return default_gpt_steps(name, kSteps, extra);
  }
};

double inter_of(const json& record, const std::string& kind) {
  const json& bytes = record["wire_bytes"];
  return bytes.contains(kind) ? bytes[kind][1].get<double>() : 0.0;
}

// Note: as tests/tools/zest_train_quantized_test.cc (the default GPT's warmup makes its first 15
// steps spiky in every run, so means over steps 26-40 are compared; qwZ + qgZ measured 1.0 %
// above fp32 there). 5 % states what is accepted and catches a collective that drops or doubles
// a rank's share, or a backward that computes with other weights than its forward.
constexpr double kTolerance = 0.05;

void expect_trains_like(const std::vector<json>& reference, const std::vector<json>& run) {
  ASSERT_EQ(reference.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(run.size(), static_cast<std::size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(reference[step]["tokens"], run[step]["tokens"]);  // equal tokens
  }
  const double expected = mean_loss(reference, 26, kSteps);
  const double measured = mean_loss(run, 26, kSteps);
  EXPECT_NEAR(measured, expected, kTolerance * expected);
  EXPECT_LT(measured, 0.6 * run[0]["loss"].get<double>());  // it learned
}

TEST_F(ZestTrainZeroPlusPlus, QwzHpzQgzTrainsAsZeroThreeAtAFifthOfTheBytesAcross) {
  const std::vector<json> plain = steps("zero3", {});
  const std::vector<json> zpp =
      steps("zeropp", {"--set", "zero_optimization.zero_quantized_weights=true", "--set",
                       "zero_optimization.zero_quantized_gradients=true", "--set",
                       "zero_optimization.zero_hpz_partition_size=2"});
  expect_trains_like(plain, zpp);
  // Measured over steps 26-40: ZeRO-3 2.4592, ZeRO++ 2.4891 (+1.2 %, the same as qwZ + qgZ
  // without hpZ: tests/engine/zero_plus_plus_test.cc holds them equal to the bit). Across nodes:
  // forward's int8 gathers only (backward's stay in the node), qgZ's node partials; measured
  // 0.160 of ZeRO-3's on this job.
  const double ratio = zpp.back()["inter_node_bytes"].get<double>() /
                       plain.back()["inter_node_bytes"].get<double>();
  EXPECT_LT(ratio, 0.2);
  EXPECT_GT(ratio, 0.1);
  EXPECT_EQ(inter_of(zpp.back(), "reduce_scatter"), 0.0);
}

// Note: qgZ alone against hybrid sharding: qwZ's own gap (issue 24's open question, studied
// apart) is larger than the tolerance in this window with hybrid sharding: measured over steps
// 26-40, hybrid 2.4592, hybrid + qgZ 2.4493 (-0.4 %), hybrid + qwZ 2.6124 (+6.2 %), hybrid + qwZ
// + qgZ 2.6155 (+6.4 %). qwZ's gathers stay inside the node here, so the bytes across are qgZ's.
TEST_F(ZestTrainZeroPlusPlus, HybridWithQgzTrainsAsHybridAtAQuarterOfTheBytesAcross) {
  const std::vector<json> hybrid =
      steps("hybrid", {"--set", "zero_optimization.hybrid_shard_size=\"node\""});
  const std::vector<json> quantized =
      steps("hybrid-qgz", {"--set", "zero_optimization.hybrid_shard_size=\"node\"", "--set",
                           "zero_optimization.zero_quantized_gradients=true"});
  expect_trains_like(hybrid, quantized);
  // Across nodes only the replicas' mean: int8 slices out, int8 means back, against the fp32
  // all-reduce: a quarter, plus 4 bytes of scale per 256 values (and the step's scalars).
  const double ratio = quantized.back()["inter_node_bytes"].get<double>() /
                       hybrid.back()["inter_node_bytes"].get<double>();
  EXPECT_NEAR(ratio, 0.25 * (1.0 + 4.0 / 256), 0.01);
  EXPECT_LT(inter_of(quantized.back(), "all_reduce"),
            1e-3 * inter_of(hybrid.back(), "all_reduce"));
}

// At 4 bits both hops are int4, the replicas' mean too: across nodes the slices out and the means
// back take half the values' bytes and the same scales, (1/2 + 4/256) / (1 + 4/256) of 8 bits'
// (the padding of each unit's runs to 4 bytes and the step's scalars move it by less than 0.005).
// Note: the loss is held to the int4 suite's tolerance (tests/tools/zest_train_int4_test.cc:
// finite, and it learns), not to hybrid's curve: measured over steps 26-40, hybrid 2.4592,
// hybrid + qgZ 2.4493, hybrid + qgZ int4 with the replicas' mean at int8 2.5074 (+2.0 %), int4
// throughout 2.5883 (+5.2 %): the mean all-gathered at int4 carries up to max / 14 of its block.
TEST_F(ZestTrainZeroPlusPlus, HybridWithInt4QgzSendsAboutHalfOfInt8sBytesAcrossAndLearns) {
  const std::vector<std::string> qgz = {"--set", "zero_optimization.hybrid_shard_size=\"node\"",
                                        "--set", "zero_optimization.zero_quantized_gradients=true"};
  std::vector<std::string> four = qgz;
  four.insert(four.end(), {"--set", "zero_optimization.zero_quantized_gradients_bits=4"});
  const std::vector<json> int8 = steps("hybrid-qgz", qgz);
  const std::vector<json> int4 = steps("hybrid-qgz-int4", four);
  ASSERT_EQ(int8.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(int4.size(), static_cast<std::size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(int8[step]["tokens"], int4[step]["tokens"]);  // equal tokens
    ASSERT_TRUE(std::isfinite(int4[step]["loss"].get<double>())) << step;
  }
  EXPECT_LT(mean_loss(int4, 26, kSteps), 0.6 * int4[0]["loss"].get<double>());  // it learned
  const double share = (0.5 + 4.0 / 256) / (1.0 + 4.0 / 256);
  const double ratio = int4.back()["inter_node_bytes"].get<double>() /
                       int8.back()["inter_node_bytes"].get<double>();
  EXPECT_NEAR(ratio, share, 0.005);
  EXPECT_NEAR(inter_of(int4.back(), "send") / inter_of(int8.back(), "send"), share, 0.005);
  EXPECT_NEAR(inter_of(int4.back(), "all_gather") / inter_of(int8.back(), "all_gather"), share,
              0.005);
}

}  // namespace
