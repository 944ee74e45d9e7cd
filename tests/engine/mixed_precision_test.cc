// bf16 and fp16 training: 2-byte parameters and gradients with fp32 master weights at every
// stage, memory against the table, and fp16's loss scaling skipping overflowed steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

using testing::RunResult;
using testing::RunSpec;
using testing::run_mlp;

TEST(MixedPrecision, Bf16TracksTheFp32LossCurve) {
  RunSpec fp32;
  fp32.steps = 100;
  fp32.stage = 2;
  fp32.world = 2;
  RunSpec bf16 = fp32;
  bf16.compute_dtype = DType::kBFloat16;
  const RunResult reference = run_mlp(fp32);
  const RunResult run = run_mlp(bf16);
  // bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ≈ 0.2%); over 100 steps of Adam on
  // fresh batches the loss curves drift apart by a few percent at most. 5% per step, on a
  // curve that falls by about a third, tells a working bf16 path from a broken one.
  for (int step = 0; step < fp32.steps; ++step) {
    EXPECT_NEAR(run.losses[step], reference.losses[step], 0.05 * reference.losses[step])
        << "step " << step;
  }
  EXPECT_LT(run.losses.back(), 0.85f * run.losses.front());
}

class TwoByteMemory : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(TwoByteMemory, ModelStatePeakEqualsTheTableWithTwoBytes) {
  const auto [stage, dtype] = GetParam();
  RunSpec spec;
  spec.stage = stage;
  spec.world = 4;
  spec.steps = 2;
  spec.sizes = {64, 128, 96, 10};
  spec.compute_dtype = dtype;
  RunSpec fp32 = spec;
  fp32.compute_dtype = DType::kFloat32;
  const RunResult run = run_mlp(spec);
  const MemoryPrediction wide = run_mlp(fp32).predicted[0];
  for (int rank = 0; rank < spec.world; ++rank) {
    const MemoryUsage& usage = run.usage[rank];
    const MemoryPrediction& predicted = run.predicted[rank];
    EXPECT_EQ(usage.peak_of(Category::kParams), predicted.params);
    EXPECT_EQ(usage.peak_of(Category::kGrads), predicted.grads);
    EXPECT_EQ(usage.peak_of(Category::kOptimizer), predicted.optimizer);
  }
  // The memory table (docs/architecture.md): 2 bytes where fp32 had 4, and K = 12 (master + two
  // moments) where fp32's parameters were their own master (K = 8).
  const MemoryPrediction& narrow = run.predicted[0];
  EXPECT_EQ(narrow.params * 2, wide.params);
  EXPECT_EQ(narrow.grads * 2, wide.grads);
  EXPECT_EQ(narrow.optimizer * 2, wide.optimizer * 3);
}

INSTANTIATE_TEST_SUITE_P(Stages, TwoByteMemory,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat16)),
                         [](const auto& info) {
                           return "stage" + std::to_string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

TEST(MixedPrecision, Bf16StagesAgreeWithEachOther) {
  RunSpec reference;
  reference.steps = 10;
  reference.compute_dtype = DType::kBFloat16;
  const RunResult single = run_mlp(reference);
  for (int stage : {0, 1, 2, 3}) {
    RunSpec spec = reference;
    spec.stage = stage;
    spec.world = 4;
    const RunResult run = run_mlp(spec);
    // Sharding changes only the order of fp32 sums before each bf16 rounding; a flipped
    // rounding moves a value by one bf16 ulp (2^-8 relative), so losses agree to ~1%.
    for (int step = 0; step < reference.steps; ++step) {
      EXPECT_NEAR(run.losses[step], single.losses[step], 0.01 * single.losses[step])
          << "stage " << stage << " step " << step;
    }
  }
}

TEST(MixedPrecision, CommunicationInBf16WithFp32Compute) {
  RunSpec fp32;
  fp32.steps = 10;
  fp32.stage = 2;
  fp32.world = 3;
  RunSpec narrow_wire = fp32;
  narrow_wire.communication_dtype = DType::kBFloat16;
  const RunResult reference = run_mlp(fp32);
  const RunResult run = run_mlp(narrow_wire);
  for (int step = 0; step < fp32.steps; ++step) {
    EXPECT_NEAR(run.losses[step], reference.losses[step], 0.01 * reference.losses[step]);
  }
}

// A unit that passes its input through and, when told, writes inf into its gradient: the
// overflow fp16 training must survive.
class PoisonUnit final : public Unit {
 public:
  PoisonUnit(std::int64_t width, const bool* poison) : width_(width), poison_(poison) {}
  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override {
    return {{"gate", {width_}, Initializer::zeros(), false}};
  }
  void forward(UnitContext& context) override {
    Tensor in = context.input();
    Tensor out = context.make_output(in.shape, DType::kFloat32);
    context.stream().enqueue([in, out] { std::memcpy(out.data, in.data, in.bytes()); });
  }
  void backward(UnitContext& context) override {
    Tensor grad_out = context.grad_output();
    Tensor grad = context.grad(0);
    const bool poison = *poison_;
    context.stream().enqueue([grad, poison] {
      if (poison) grad.as<float>()[0] = INFINITY;
    });
    (void)grad_out;  // the first unit makes no input gradient
  }

 private:
  std::string name_ = "poison";
  std::int64_t width_;
  const bool* poison_;
};

class PoisonedMlp final : public Module {
 public:
  PoisonedMlp(const std::vector<std::int64_t>& sizes, const bool* poison)
      : poison_(sizes.front(), poison), mlp_(MlpConfig{sizes}) {}
  std::vector<Unit*> units() override {
    std::vector<Unit*> all = {&poison_};
    for (Unit* unit : mlp_.units()) all.push_back(unit);
    return all;
  }

 private:
  PoisonUnit poison_;
  Mlp mlp_;
};

TEST(LossScaling, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    constexpr int kPoisonedStep = 3;
    bool poison[4] = {false, false, false, false};
    RunSpec spec;
    spec.stage = stage;
    spec.world = 4;
    spec.steps = 6;
    spec.compute_dtype = DType::kFloat16;
    spec.loss_scale.enabled = true;
    spec.loss_scale.initial_scale_power = 10;
    spec.loss_scale.hysteresis = 1;
    std::vector<std::map<std::string, std::vector<float>>> before(4), after(4);
    spec.make_model = [&](int rank) {
      return std::make_unique<PoisonedMlp>(spec.sizes, &poison[rank]);
    };
    spec.after_step = [&](int rank, int step, const StepStats& stats, Trainer& trainer) {
      // Only rank 1 overflows, during the step after kPoisonedStep - 1.
      poison[rank] = rank == 1 && step + 1 == kPoisonedStep;
      if (step == kPoisonedStep - 1 || step == kPoisonedStep) {
        auto& snapshot = step == kPoisonedStep - 1 ? before[rank] : after[rank];
        for (const std::string& name : trainer.parameter_names()) {
          snapshot[name] = trainer.full_parameter(name);
        }
      }
      EXPECT_EQ(stats.skipped, step == kPoisonedStep) << "rank " << rank << " step " << step;
    };
    const RunResult run = run_mlp(spec);
    EXPECT_EQ(run.stats[kPoisonedStep - 1].loss_scale, 1024.0f);
    EXPECT_TRUE(run.stats[kPoisonedStep].skipped);
    EXPECT_EQ(run.stats[kPoisonedStep + 1].loss_scale, 512.0f);
    for (int rank = 0; rank < 4; ++rank) {
      for (const auto& [name, values] : before[rank]) {
        const std::vector<float>& later = after[rank].at(name);
        EXPECT_EQ(std::memcmp(values.data(), later.data(), values.size() * sizeof(float)), 0)
            << name << " changed in a skipped step on rank " << rank;
      }
    }
    for (const auto& [name, values] : run.params) {
      for (float value : values) ASSERT_TRUE(std::isfinite(value)) << name;
    }
  }
}

TEST(LossScaling, HysteresisDelaysTheBackOff) {
  LossScaleOptions options;
  options.enabled = true;
  options.initial_scale_power = 4;
  options.hysteresis = 2;
  options.loss_scale_window = 3;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.scale(), 16.0f);
  scaler.update(true);  // first overflow: hysteresis absorbs it
  EXPECT_EQ(scaler.scale(), 16.0f);
  scaler.update(true);  // second: the scale halves
  EXPECT_EQ(scaler.scale(), 8.0f);
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8.0f);
  scaler.update(false);  // a window of clean steps after the overflow: the scale doubles
  EXPECT_EQ(scaler.scale(), 16.0f);
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(LossScaling, OverflowAtTheMinimumScaleIsAnError) {
  LossScaleOptions options;
  options.enabled = true;
  options.initial_scale_power = 1;
  options.hysteresis = 1;
  options.min_loss_scale = 1.0f;
  LossScaler scaler(options);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1.0f);
  try {
    scaler.update(true);
    FAIL() << "expected an error at the minimum scale";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("minimum loss scale"), std::string::npos);
  }
}

}  // namespace
}  // namespace zest
