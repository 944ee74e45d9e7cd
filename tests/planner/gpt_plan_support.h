// Shared by the planner's GPT suites (qgZ, hpZ, ZeRO++, qwZ's staging, vocabulary pieces, large
// vocabularies): a GPT's plan input for a job's engine options, and the same job trained for two
// steps, each rank on its own random tokens, with frees held until a wait proves them
// (WorldOptions::hold_frees), as the plan replays them. The suites then compare measured and
// planned (tests/planner/measured_peaks.h).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/recompute.h"
#include "memory/allocator.h"
#include "models/gpt.h"
#include "planner/peak_plan.h"
#include "runtime/world.h"

namespace zest::testing {

// A job's engine options: its stage, compute and communication in `dtype`, `accumulation`
// micro-batches a step, recomputation by `recompute`; a suite adds its ZeRO++ options.
inline EngineOptions engine_options(int stage, DType dtype, int accumulation,
                                    RecomputePolicy recompute = RecomputePolicy::kNone) {
  EngineOptions options;
  options.stage = stage;
  options.compute_dtype = dtype;
  options.communication_dtype = dtype;
  options.gradient_accumulation_steps = accumulation;
  options.activation_checkpointing.policy = recompute;
  return options;
}

// The plan input of `config` on batches of `sequences`, with AdamW's states, sharded over
// `world` ranks.
inline PeakPlanInput gpt_plan_input(const GptConfig& config, std::int64_t sequences,
                                    const EngineOptions& options, int world) {
  Gpt model(config);
  return plan_input(model, {sequences, config.seq_len}, options,
                    make_optimizer(OptimizerOptions{})->state_count(), world);
}

// Trains `config` with AdamW on the ranks of `world` for two steps of
// options.gradient_accumulation_steps micro-batches of `sequences`, rank r's tokens drawn from
// seed + r, then calls `done(context, trainer)` on every rank (after a synchronize).
inline void train_gpt_two_steps(const GptConfig& config, std::int64_t sequences,
                                const EngineOptions& options, WorldOptions world,
                                std::uint32_t seed,
                                const std::function<void(RankContext&, Trainer&)>& done) {
  world.hold_frees = true;  // frees when a wait proves them, as the plan replays them
  World(world).run([&](RankContext& context) {
    Gpt model(config);
    Engine engine(context, options);
    auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
    std::mt19937 rng(seed + static_cast<std::uint32_t>(context.rank));
    std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
    std::vector<std::int32_t> inputs(sequences * config.seq_len);
    std::vector<std::int32_t> targets(inputs.size());
    for (auto& id : inputs) id = token(rng);
    for (auto& id : targets) id = token(rng);
    const Batch batch{Tensor{inputs.data(), {sequences, config.seq_len}, DType::kInt32},
                      Tensor{targets.data(), {sequences, config.seq_len}, DType::kInt32}};
    for (int step = 0; step < 2; ++step) {
      for (int micro = 0; micro < options.gradient_accumulation_steps; ++micro) {
        trainer->forward_backward(batch);
      }
      trainer->step();
    }
    context.synchronize();
    done(context, *trainer);
  });
}

// Each rank's allocator usage after train_gpt_two_steps.
inline std::vector<MemoryUsage> gpt_usage_after_two_steps(const GptConfig& config,
                                                          std::int64_t sequences,
                                                          const EngineOptions& options,
                                                          const WorldOptions& world,
                                                          std::uint32_t seed = 3) {
  std::vector<MemoryUsage> usage(static_cast<std::size_t>(world.ranks));
  train_gpt_two_steps(config, sequences, options, world, seed,
                      [&](RankContext& context, Trainer&) {
                        usage[static_cast<std::size_t>(context.rank)] =
                            context.allocator().usage();
                      });
  return usage;
}

}  // namespace zest::testing
