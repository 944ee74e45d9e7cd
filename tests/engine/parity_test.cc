// Every stage at every world size trains the MLP to the same numbers as one rank at stage 0.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

// 1e-6 relative: the runs differ only in the order fp32 sums are taken (a mean of per-rank means
// against one mean over all rows, a reduce in rank order), about 1e-7 relative per step; 20
// steps of Adam do not amplify that past 1e-6 on this well-conditioned problem. The absolute
// floor covers values that cross zero.
constexpr double kRelative = 1e-6;
constexpr double kAbsolute = 1e-7;

void expect_close(float expected, float actual, const std::string& what) {
  const double tolerance = kRelative * std::abs(expected) + kAbsolute;
  EXPECT_NEAR(expected, actual, tolerance) << what;
}

void expect_same_training(const RunResult& reference, const RunResult& run) {
  ASSERT_EQ(reference.losses.size(), run.losses.size());
  for (std::size_t step = 0; step < reference.losses.size(); ++step) {
    expect_close(reference.losses[step], run.losses[step], "loss at step " + std::to_string(step));
  }
  ASSERT_EQ(reference.params.size(), run.params.size());
  for (const auto& [name, values] : reference.params) {
    const std::vector<float>& other = run.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    for (std::size_t i = 0; i < values.size(); ++i) {
      expect_close(values[i], other[i], name + "[" + std::to_string(i) + "]");
      if (::testing::Test::HasFailure()) return;  // one mismatch says enough
    }
  }
}

class EngineParity : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(EngineParity, MatchesSingleRankUnshardedRun) {
  const auto [optimizer, stage, world] = GetParam();
  RunSpec reference_spec;
  reference_spec.optimizer = optimizer;
  static std::map<std::string, RunResult> references;
  if (!references.count(optimizer)) references[optimizer] = run_mlp(reference_spec);
  const RunResult& reference = references[optimizer];

  RunSpec spec = reference_spec;
  spec.stage = stage;
  spec.world = world;
  expect_same_training(reference, run_mlp(spec));
}

INSTANTIATE_TEST_SUITE_P(
    StagesAndWorlds, EngineParity,
    ::testing::Combine(::testing::Values("AdamW", "SGD"), ::testing::Values(0, 1, 2, 3),
                       ::testing::Values(1, 2, 3, 4, 5)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_stage" + std::to_string(std::get<1>(info.param)) +
             "_world" + std::to_string(std::get<2>(info.param));
    });

TEST(EngineTraining, LossFallsOnALearnableTask) {
  RunSpec spec;
  spec.steps = 80;
  spec.stage = 3;
  spec.world = 4;
  RunResult run = run_mlp(spec);
  // Each step sees a fresh batch, so compare averages of five steps, not single losses.
  auto mean_of = [&](std::size_t first) {
    float sum = 0.0f;
    for (std::size_t i = first; i < first + 5; ++i) sum += run.losses[i];
    return sum / 5.0f;
  };
  EXPECT_LT(mean_of(run.losses.size() - 5), 0.75f * mean_of(0));
}

TEST(EngineTraining, GradientAccumulationMatchesOneLargeMicroBatch) {
  for (int world : {1, 3, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      RunSpec whole;
      whole.stage = stage;
      whole.world = world;
      whole.steps = 8;
      whole.global_batch = 120;  // divisible by world × accumulation for every case
      RunSpec accumulated = whole;
      accumulated.accumulation = 2;
      SCOPED_TRACE("world " + std::to_string(world) + " stage " + std::to_string(stage));
      expect_same_training(run_mlp(whole), run_mlp(accumulated));
    }
  }
}

TEST(EngineTraining, ClippingBoundsTheUpdateAndMatchesAcrossStages) {
  RunSpec reference;
  reference.clipping = 0.05f;
  reference.steps = 8;
  RunResult single = run_mlp(reference);
  // Gradients of this model start well above 0.05, so the clip is active.
  EXPECT_GT(single.grad_norms.front(), 0.05f);
  RunSpec sharded = reference;
  sharded.stage = 2;
  sharded.world = 4;
  expect_same_training(single, run_mlp(sharded));
}

}  // namespace
}  // namespace zest

namespace zest {
namespace {

// A unit whose gradient is known in closed form: rank r adds (i + 1) × 0.001 × (r + 1) to
// element i. Its loss is 0; it exists to check the engine's gradient norm.
class KnownGradientUnit final : public Unit {
 public:
  KnownGradientUnit(std::int64_t size, int rank) : size_(size), rank_(rank) {}
  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override {
    return {{"a", {size_ / 2}, Initializer::zeros(), true},
            {"b", {size_ - size_ / 2}, Initializer::zeros(), false}};
  }
  void forward(UnitContext& context) override {
    float* loss = context.loss();
    context.stream().enqueue([loss] { *loss = 0.0f; });
  }
  void backward(UnitContext& context) override {
    Tensor a = context.grad(0), b = context.grad(1);
    const int rank = rank_;
    context.stream().enqueue([a, b, rank] {
      std::size_t i = 0;
      for (Tensor grad : {a, b}) {
        for (std::size_t k = 0; k < grad.numel(); ++k, ++i) {
          grad.as<float>()[k] += static_cast<float>((i + 1) * 0.001 * (rank + 1));
        }
      }
    });
  }

 private:
  std::string name_ = "known";
  std::int64_t size_;
  int rank_;
};

class KnownGradientModule final : public Module {
 public:
  KnownGradientModule(std::int64_t size, int rank) : unit_(size, rank) {}
  std::vector<Unit*> units() override { return {&unit_}; }

 private:
  KnownGradientUnit unit_;
};

constexpr std::int64_t kSize = 1001;

TEST(EngineTraining, GradNormEqualsAFloat64Recomputation) {
  for (int world : {1, 3, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      RunSpec spec;
      spec.stage = stage;
      spec.world = world;
      spec.steps = 1;
      spec.make_model = [](int rank) { return std::make_unique<KnownGradientModule>(kSize, rank); };
      const RunResult run = run_mlp(spec);
      // The engine averages over ranks: element i's gradient is (i + 1) × 0.001 × mean(r + 1).
      const double mean_factor = (world + 1) / 2.0;
      double square_sum = 0.0;
      for (std::int64_t i = 0; i < kSize; ++i) {
        const double g = (i + 1) * 0.001 * mean_factor;
        square_sum += g * g;
      }
      // fp32 gradients (relative rounding 6e-8) summed in double: 1e-6 relative is ample.
      EXPECT_NEAR(run.grad_norms[0], std::sqrt(square_sum), 1e-6 * std::sqrt(square_sum))
          << "world " << world << " stage " << stage;
    }
  }
}

}  // namespace
}  // namespace zest
