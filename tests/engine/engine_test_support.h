// Shared by the engine's tests: train the MLP for a few steps at a given stage and world size on
// a fixed synthetic global batch, and collect per-step losses and final parameters.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "models/mlp.h"
#include "engine/engine.h"
#include "engine/zero_trainer.h"
#include "runtime/world.h"

namespace zest::testing {

struct RunResult {
  std::vector<float> losses;
  std::vector<float> grad_norms;
  std::vector<StepStats> stats;
  std::map<std::string, std::vector<float>> params;
  std::vector<MemoryUsage> usage;  // per rank, at the end
  std::vector<MemoryUsage> host_usage;  // per rank, at the end: the device's host arena
  std::vector<MemoryPrediction> predicted;
  std::vector<MemoryUsage> between_steps;  // per rank, after the last step
  std::vector<std::size_t> gathered_between_steps;
};

struct RunSpec {
  int stage = 0;
  int world = 1;
  std::string optimizer = "AdamW";
  int steps = 20;
  int global_batch = 60;
  int accumulation = 1;
  std::vector<std::int64_t> sizes = {13, 31, 17, 7};
  float clipping = 0.0f;
  DType compute_dtype = DType::kFloat32;
  DType communication_dtype = DType::kFloat32;
  LossScaleOptions loss_scale;
  float lr = 0.0f;  // 0: the optimizer's default for the test
  // Called on every rank after each step with (rank, step index, stats); may inspect the trainer.
  std::function<void(int, int, const StepStats&, Trainer&)> after_step;
  // Adjust the engine's and the world's options beyond the fields above.
  std::function<void(EngineOptions&)> configure_engine;
  std::function<void(WorldOptions&)> configure_world;
  // Builds the model for a rank (default: the MLP of `sizes`).
  std::function<std::unique_ptr<Module>(int rank)> make_model;
};

// The global batch of `step`, all rows; every rank slices its own rows from it.
inline void make_global_batch(int step, int rows, int features, int classes,
                              std::vector<float>& inputs, std::vector<std::int32_t>& targets) {
  std::mt19937 rng(1000 + step);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  inputs.resize(static_cast<std::size_t>(rows) * features);
  targets.resize(rows);
  for (float& x : inputs) x = normal(rng);
  // A learnable rule: the class a fixed random linear teacher scores highest.
  std::mt19937 teacher_rng(7);
  std::vector<float> teacher(static_cast<std::size_t>(classes) * features);
  for (float& w : teacher) w = normal(teacher_rng);
  for (int r = 0; r < rows; ++r) {
    int best = 0;
    float best_score = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float score = 0.0f;
      for (int f = 0; f < features; ++f) {
        score += teacher[static_cast<std::size_t>(c) * features + f] *
                 inputs[static_cast<std::size_t>(r) * features + f];
      }
      if (score > best_score) best_score = score, best = c;
    }
    targets[r] = best;
  }
}

// Rows [block * rows, (block + 1) * rows) of a global batch of `features`-wide float inputs and
// int32 classes, as a view into them: a rank's rows are its block (micro * world + rank when the
// rows are dealt rank-major within each micro-batch).
inline Batch rank_rows(std::vector<float>& inputs, std::vector<std::int32_t>& targets,
                       int features, int block, int rows) {
  const std::size_t first = static_cast<std::size_t>(block) * rows;
  return Batch{Tensor{inputs.data() + first * features, {rows, features}, DType::kFloat32},
               Tensor{targets.data() + first, {rows}, DType::kInt32}};
}

inline RunResult run_mlp(const RunSpec& spec) {
  RunResult result;
  result.losses.resize(spec.steps);
  result.grad_norms.resize(spec.steps);
  result.stats.resize(spec.steps);
  result.usage.resize(spec.world);
  result.host_usage.resize(spec.world);
  result.predicted.resize(spec.world);
  result.between_steps.resize(spec.world);
  result.gathered_between_steps.resize(spec.world);
  WorldOptions world_options;
  world_options.ranks = spec.world;
  world_options.timeout = std::chrono::seconds(60);
  if (spec.configure_world) spec.configure_world(world_options);
  World world(world_options);
  world.run([&](RankContext& context) {
    std::unique_ptr<Module> model = spec.make_model ? spec.make_model(context.rank)
                                                    : std::make_unique<Mlp>(MlpConfig{spec.sizes});
    EngineOptions options;
    options.compute_dtype = spec.compute_dtype;
    options.communication_dtype = spec.communication_dtype;
    options.loss_scale = spec.loss_scale;
    if (spec.configure_engine) spec.configure_engine(options);
    options.stage = spec.stage;
    options.gradient_accumulation_steps = spec.accumulation;
    options.gradient_clipping = spec.clipping;
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.type = spec.optimizer;
    optimizer.lr = spec.lr > 0.0f ? spec.lr : spec.optimizer == "SGD" ? 0.05f : 3e-3f;
    optimizer.weight_decay = 0.01f;
    optimizer.momentum = 0.9f;
    auto trainer = engine.shard(*model, make_optimizer(optimizer));
    const int features = static_cast<int>(spec.sizes.front());
    const int classes = static_cast<int>(spec.sizes.back());
    const int local_rows = spec.global_batch / spec.world / spec.accumulation;
    std::vector<float> inputs;
    std::vector<std::int32_t> targets;
    for (int step = 0; step < spec.steps; ++step) {
      make_global_batch(step, spec.global_batch, features, classes, inputs, targets);
      for (int micro = 0; micro < spec.accumulation; ++micro) {
        // Rows are dealt rank-major within each micro-batch, so that every micro-batch of the
        // single-rank run holds the same rows as the matching micro-batches of all ranks.
        trainer->forward_backward(rank_rows(inputs, targets, features,
                                            micro * spec.world + context.rank, local_rows));
      }
      StepStats stats = trainer->step();
      if (context.rank == 0) {
        result.losses[step] = stats.loss;
        result.grad_norms[step] = stats.grad_norm;
        result.stats[step] = stats;
      }
      if (spec.after_step) spec.after_step(context.rank, step, stats, *trainer);
    }
    context.synchronize();
    result.between_steps[context.rank] = context.allocator().usage();
    if (auto* zero = dynamic_cast<ZeroTrainer*>(trainer.get())) {
      result.gathered_between_steps[context.rank] = zero->gathered_units();
    }
    for (const std::string& name : trainer->parameter_names()) {
      std::vector<float> value = trainer->full_parameter(name);
      if (context.rank == 0) result.params[name] = std::move(value);
    }
    result.usage[context.rank] = context.allocator().usage();
    result.host_usage[context.rank] = context.device.host_allocator().usage();
    result.predicted[context.rank] = trainer->predicted_memory();
  });
  return result;
}

// run_mlp as ranks that are threads of this process, also when mpirun started it as one of
// several: Open MPI's size variable is hidden while the World is made, since a `local` world
// refuses to start as one of several mpirun processes (it would be N copies of one job). The
// reference of the multi-process suites.
inline RunResult run_mlp_as_threads(const RunSpec& spec) {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const std::optional<std::string> saved = size ? std::optional<std::string>(size) : std::nullopt;
  unsetenv("OMPI_COMM_WORLD_SIZE");
  RunResult result = run_mlp(spec);
  if (saved) setenv("OMPI_COMM_WORLD_SIZE", saved->c_str(), 1);
  return result;
}

}  // namespace zest::testing
