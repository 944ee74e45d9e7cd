// ctest-labels: slow
// ZeRO++'s quantized collectives through zest-train on the default GPT (configs/default.json,
// the text corpus, stage 3, 4 ranks on 2 nodes): with zero_quantized_weights and
// zero_quantized_gradients the loss curve stays within the stated tolerance of the fp32 run at
// equal tokens, and the bytes across nodes per step fall to a quarter (and a little more, for
// the scales).
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/tools/zest_train_support.h"

namespace {

using nlohmann::json;
using zest::testing::mean_loss;

constexpr int kSteps = 40;

class ZestTrainQuantized : public zest::testing::DefaultGptOnTwoNodesTest {
 protected:
  std::vector<json> steps(const std::string& name, const std::vector<std::string>& extra) const {
    return default_gpt_steps(name, kSteps, extra);
  }
};

// Note: the default GPT's warmup to lr 3e-3 makes its first 15 steps spiky (loss jumps of 2x
// in both runs, at slightly different steps), so the check compares means over the steps after:
// 26-40. Measured there (2026-12-01): int8 qwZ + qgZ at block 256 ran 1.0 % above fp32 (fp32
// with another summation order, hybrid sharding: 2e-6); the 300-step gap is in
// benchmarks/RESULTS.md. 5 % states what is accepted and catches a collective that drops or
// doubles a rank's share (tens of percent, or divergence).
TEST_F(ZestTrainQuantized, DefaultGptTrainsWithinTheToleranceOfFp32AtEqualTokens) {
  const std::vector<json> fp32 = steps("fp32", {});
  const std::vector<json> quantized =
      steps("int8", {"--set", "zero_optimization.zero_quantized_weights=true", "--set",
                     "zero_optimization.zero_quantized_gradients=true"});
  ASSERT_EQ(fp32.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(quantized.size(), static_cast<std::size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(fp32[step]["tokens"], quantized[step]["tokens"]);  // equal tokens
  }
  const double reference = mean_loss(fp32, 26, kSteps);
  const double measured = mean_loss(quantized, 26, kSteps);
  EXPECT_NEAR(measured, reference, 0.05 * reference);
  EXPECT_LT(measured, 0.6 * quantized[0]["loss"].get<double>());  // it learned
  // Across nodes per step: gathers at a quarter of fp32 (plus 4 bytes of scale per 256 values),
  // the gradient reduction as int8 node partials instead of the ring's share.
  const double plain_inter = fp32.back()["inter_node_bytes"].get<double>();
  const double int8_inter = quantized.back()["inter_node_bytes"].get<double>();
  const double plain_gather = fp32.back()["wire_bytes"]["all_gather"][1].get<double>();
  const double int8_gather = quantized.back()["wire_bytes"]["all_gather"][1].get<double>();
  EXPECT_NEAR(int8_gather / plain_gather, 0.25 * (1.0 + 4.0 / 256), 0.002);
  EXPECT_LT(int8_inter, 0.25 * plain_inter);
}

}  // namespace
