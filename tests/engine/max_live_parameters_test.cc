// zero_optimization.stage3_max_live_parameters: the ZeRO-3 gather ring holds at most that many
// gathered elements (whole slots of the largest unit), down to one slot, where gathers no longer
// run ahead of compute but training is the same; below one unit it is a config error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "models/mlp.h"
#include "engine/engine.h"
#include "runtime/world.h"
#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

struct RingRun {
  std::size_t gather_peak = 0;  // bytes, rank 0
  float loss = 0.0f;            // of the second step
};

// Two steps on 2 ranks at stage 3 of an MLP of three equal layers (each unit 32x32 + 32 = 1056
// elements, padded to 1088 for 2 ranks x 32).
RingRun ring_run(std::size_t max_live, std::size_t prefetch) {
  RingRun run;
  WorldOptions world_options;
  world_options.ranks = 2;
  World(world_options).run([&](RankContext& context) {
    Mlp model(MlpConfig{{32, 32, 32, 32}});
    EngineOptions options;
    options.stage = 3;
    options.stage3_prefetch_bucket_size = prefetch;
    options.stage3_max_live_parameters = max_live;
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::vector<float> inputs(16 * 32);
    std::vector<std::int32_t> labels(16);
    for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = std::sin(0.1f * i);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 32);
    const Batch batch = testing::rank_rows(inputs, labels, 32, context.rank, 8);
    for (int step = 0; step < 2; ++step) {
      trainer->forward_backward(batch);
      const StepStats stats = trainer->step();
      if (context.rank == 0) run.loss = stats.loss;
    }
    if (context.rank == 0) run.gather_peak = context.allocator().usage().peak_of(Category::kGather);
  });
  return run;
}

TEST(MaxLiveParameters, CapsTheGatherRing) {
  constexpr std::size_t kUnit = 1088 * sizeof(float);
  const RingRun whole = ring_run(0, 1 << 20);  // every unit ahead: the whole model
  const RingRun two = ring_run(2200, 1 << 20);
  const RingRun one = ring_run(1100, 1 << 20);  // no gather ahead of compute: serial
  EXPECT_EQ(whole.gather_peak, 3 * kUnit);
  EXPECT_EQ(two.gather_peak, 2 * kUnit);
  EXPECT_EQ(one.gather_peak, 1 * kUnit);
  // The same training whatever the ring holds.
  EXPECT_EQ(two.loss, whole.loss);
  EXPECT_EQ(one.loss, whole.loss);
}

TEST(MaxLiveParameters, BelowOneUnitIsAConfigError) {
  try {
    ring_run(1000, 0);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(error.what())
                  .find("zero_optimization.stage3_max_live_parameters: 1000 is below what one "
                        "computation needs: 1 unit(s) of up to 1088 elements (1088)"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace zest
