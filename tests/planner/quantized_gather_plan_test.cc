// qwZ's staging buffer in the plan: blocks restart at each parameter inside a shard
// (engine/quantized_collectives.h, quantized_runs), so a rank's packed shard is larger than one
// run over the whole shard by the extra runs' scales and padding. The planner sizes it from the
// units' layouts as the engine does, and the allocator measures the gather category to the byte:
// the ring and the staging buffer are allocated once, before the first step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/quantized_collectives.h"
#include "kernels/quantize.h"
#include "models/gpt.h"
#include "planner/peak_plan.h"
#include "runtime/world.h"
#include "tests/planner/gpt_plan_support.h"

namespace zest {
namespace {

// A block's LayerNorm gain and bias lie in the same shard as the start of c_attn's weight.
const GptConfig kGpt{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/48, /*vocab_size=*/96,
                     /*seq_len=*/16};
constexpr std::int64_t kSequences = 2;

EngineOptions quantized(std::size_t block) {
  EngineOptions options;
  options.stage = 3;
  options.quantized_weights = true;
  options.quantization_block = block;
  return options;
}

PeakPrediction plan(const EngineOptions& options, int world) {
  return predict_peak(testing::gpt_plan_input(kGpt, kSequences, options, world));
}

struct Measured {
  std::vector<std::size_t> gather_peaks;  // per rank
  std::vector<ShardLayout> layouts;
};

Measured train(const EngineOptions& options, int world) {
  Measured measured;
  measured.gather_peaks.resize(static_cast<std::size_t>(world));
  WorldOptions world_options;
  world_options.ranks = world;
  testing::train_gpt_two_steps(kGpt, kSequences, options, world_options, /*seed=*/3,
                               [&](RankContext& context, Trainer& trainer) {
                                 measured.gather_peaks[static_cast<std::size_t>(context.rank)] =
                                     context.allocator().usage().peak_of(Category::kGather);
                                 if (context.rank == 0) measured.layouts = trainer.layouts();
                               });
  return measured;
}

TEST(QuantizedGatherPlan, GatherEqualsTheMeasuredToTheByteWithRunsPerParameter) {
  for (int world : {2, 3, 4}) {
    for (std::size_t block : {std::size_t{64}, std::size_t{256}}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", block " + std::to_string(block));
      const EngineOptions options = quantized(block);
      const PeakPrediction planned = plan(options, world);
      const Measured measured = train(options, world);
      for (std::size_t peak : measured.gather_peaks) EXPECT_EQ(peak, planned.of(Category::kGather));
      // The staging buffer is what qwZ adds to the ring, sized from the layouts...
      EngineOptions plain = options;
      plain.quantized_weights = false;
      const std::size_t staging = quantized_gather_bytes(measured.layouts, block);
      EXPECT_EQ(planned.of(Category::kGather) - plan(plain, world).of(Category::kGather), staging);
      // ...and larger than one run of blocks over the largest shard: parameters start inside
      // shards.
      std::size_t largest = 0;
      for (const ShardLayout& layout : measured.layouts) {
        largest = std::max(largest, layout.shard_length());
      }
      EXPECT_GT(staging, static_cast<std::size_t>(world) * quantized_bytes(largest, block));
    }
  }
}

}  // namespace
}  // namespace zest
