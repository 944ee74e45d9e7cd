// Shared by the pipeline's tests: train the MLP or a small GPT for a few steps on a fixed
// synthetic global batch, once on one rank with the ZeRO trainer (the reference) and once as
// pipeline stages × data-parallel ranks with the PipelineTrainer, and collect per-step losses
// and final parameters.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/gpt.h"
#include "models/mlp.h"
#include "pipeline/pipeline_trainer.h"
#include "runtime/world.h"

namespace zest::testing {

// kWideMlp: layers large enough that compute, not the interpreter's overhead, fills a trace.
enum class TestModel { kMlp, kGpt, kWideMlp };

// 5 MLP layers (so 2, 3 and 4 stages split them unevenly) and a GPT of 4 blocks (6 units).
inline const std::vector<std::int64_t> kMlpSizes = {12, 20, 18, 16, 14, 6};
inline const GptConfig kGptConfig{/*n_layer=*/4, /*n_head=*/2, /*n_embd=*/16, /*vocab_size=*/37,
                                  /*seq_len=*/8};

inline const std::vector<std::int64_t> kWideMlpSizes = {256, 512, 512, 512, 512, 10};

inline bool is_mlp(TestModel model) { return model != TestModel::kGpt; }
inline const std::vector<std::int64_t>& mlp_sizes(TestModel model) {
  return model == TestModel::kWideMlp ? kWideMlpSizes : kMlpSizes;
}

inline ModuleFactory model_factory(TestModel model) {
  if (is_mlp(model)) {
    return [model] { return std::make_unique<Mlp>(MlpConfig{mlp_sizes(model)}); };
  }
  return [] { return std::make_unique<Gpt>(kGptConfig); };
}

// The global batch of `step`: `rows` rows of inputs and targets, in host memory.
struct GlobalBatch {
  std::vector<float> features;
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  TestModel model = TestModel::kMlp;
  std::int64_t rows = 0;

  // Rows [first, first + count) as a Batch.
  Batch rows_of(std::int64_t first, std::int64_t count) {
    Batch batch;
    if (is_mlp(model)) {
      const std::int64_t f = mlp_sizes(model).front();
      batch.inputs = Tensor{features.data() + first * f, {count, f}, DType::kFloat32};
      batch.targets = Tensor{targets.data() + first, {count}, DType::kInt32};
    } else {
      const std::int64_t t = kGptConfig.seq_len;
      batch.inputs = Tensor{tokens.data() + first * t, {count, t}, DType::kInt32};
      batch.targets = Tensor{targets.data() + first * t, {count, t}, DType::kInt32};
    }
    return batch;
  }
};

inline GlobalBatch make_batch(TestModel model, int step, std::int64_t rows) {
  GlobalBatch batch;
  batch.model = model;
  batch.rows = rows;
  std::mt19937 rng(500 + step);
  if (is_mlp(model)) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    batch.features.resize(static_cast<std::size_t>(rows * mlp_sizes(model).front()));
    for (float& x : batch.features) x = normal(rng);
    std::uniform_int_distribution<int> cls(0, static_cast<int>(mlp_sizes(model).back()) - 1);
    batch.targets.resize(static_cast<std::size_t>(rows));
    for (auto& y : batch.targets) y = cls(rng);
  } else {
    std::uniform_int_distribution<int> token(0, kGptConfig.vocab_size - 1);
    const auto n = static_cast<std::size_t>(rows * kGptConfig.seq_len);
    batch.tokens.resize(n);
    batch.targets.resize(n);
    for (auto& x : batch.tokens) x = token(rng);
    for (auto& y : batch.targets) y = token(rng);
  }
  return batch;
}

struct TrainResult {
  std::vector<float> losses;                            // rank 0's, per step
  std::vector<float> grad_norms;                        // rank 0's, per step
  std::vector<std::vector<float>> losses_by_rank;       // forward_backward's return, per rank
  std::map<std::string, std::vector<float>> params;     // rank 0's full parameters at the end
  float evaluation = 0.0f;  // evaluate() of batch 1000 after training (rank 0's)
};

// AdamW for the MLP. SGD with momentum for the GPT: AdamW divides by the root of the squared
// gradient, so elements whose gradient is nearly zero turn fp32 summation-order differences
// (1e-7 relative) into 1e-4 relative parameter differences within 3 steps — between two
// single-rank runs too (1 against 4 accumulated micro-batches: 11 times the tolerance on this
// GPT). SGD keeps them at the order of the rounding, where the test can see a real error.
inline OptimizerOptions test_optimizer(TestModel model) {
  OptimizerOptions optimizer;
  optimizer.type = is_mlp(model) ? "AdamW" : "SGD";
  optimizer.lr = is_mlp(model) ? 3e-3f : 0.05f;
  optimizer.weight_decay = 0.01f;
  optimizer.momentum = 0.9f;
  return optimizer;
}

// One rank, the whole global batch per step in `accumulation` micro-batches: the reference.
inline TrainResult train_single(TestModel model, int steps, std::int64_t rows,
                                int accumulation = 1, float clipping = 0.0f) {
  TrainResult result;
  WorldOptions world;
  world.ranks = 1;
  World(world).run([&](RankContext& context) {
    std::unique_ptr<Module> module = model_factory(model)();
    EngineOptions options;
    options.gradient_accumulation_steps = accumulation;
    options.gradient_clipping = clipping;
    Engine engine(context, options);
    auto trainer = engine.shard(*module, make_optimizer(test_optimizer(model)));
    for (int s = 0; s < steps; ++s) {
      GlobalBatch batch = make_batch(model, s, rows);
      const std::int64_t part = rows / accumulation;
      for (int a = 0; a < accumulation; ++a) trainer->forward_backward(batch.rows_of(a * part, part));
      const StepStats stats = trainer->step();
      result.losses.push_back(stats.loss);
      result.grad_norms.push_back(stats.grad_norm);
    }
    for (const std::string& name : trainer->parameter_names()) {
      result.params[name] = trainer->full_parameter(name);
    }
    GlobalBatch held_out = make_batch(model, 1000, rows);
    result.evaluation = trainer->evaluate(held_out.rows_of(0, rows));
  });
  return result;
}

struct PipelineSpec {
  TestModel model = TestModel::kMlp;
  int stages = 2;
  int data_parallel = 1;
  int zero_stage = 0;
  PipelineOptions pipeline;  // stages and the rest; stages is overwritten from `stages`
  int steps = 3;
  std::int64_t rows = 48;    // global batch
  std::function<void(EngineOptions&)> configure_engine;
  std::function<void(WorldOptions&)> configure_world;
  // Called on every rank: once the trainer is built; after each forward_backward (before
  // step()); after the last step (a collective may run in it).
  std::function<void(int rank, PipelineTrainer&)> configure_trainer;
  std::function<void(int rank, PipelineTrainer&)> after_forward_backward;
  std::function<void(int rank, PipelineTrainer&)> after_training;
};

inline TrainResult train_pipeline(const PipelineSpec& spec) {
  TrainResult result;
  const int ranks = spec.stages * spec.data_parallel;
  result.losses_by_rank.resize(static_cast<std::size_t>(ranks));
  WorldOptions world;
  world.ranks = ranks;
  world.timeout = std::chrono::seconds(30);
  if (spec.configure_world) spec.configure_world(world);
  World(world).run([&](RankContext& context) {
    EngineOptions options;
    options.stage = spec.zero_stage;
    if (spec.configure_engine) spec.configure_engine(options);
    PipelineOptions pipeline = spec.pipeline;
    pipeline.stages = spec.stages;
    PipelineTrainer trainer(context, options, pipeline, model_factory(spec.model),
                            test_optimizer(spec.model));
    if (spec.configure_trainer) spec.configure_trainer(context.rank, trainer);
    const std::int64_t local = spec.rows / spec.data_parallel;
    const std::int64_t first = trainer.mesh().coordinate(context.rank).data_parallel_index * local;
    for (int s = 0; s < spec.steps; ++s) {
      GlobalBatch batch = make_batch(spec.model, s, spec.rows);
      const float loss = trainer.forward_backward(batch.rows_of(first, local));
      result.losses_by_rank[static_cast<std::size_t>(context.rank)].push_back(loss);
      if (spec.after_forward_backward) spec.after_forward_backward(context.rank, trainer);
      const StepStats stats = trainer.step();
      if (context.rank == 0) result.losses.push_back(stats.loss);
      if (context.rank == 0) result.grad_norms.push_back(stats.grad_norm);
    }
    for (const std::string& name : trainer.parameter_names()) {
      std::vector<float> value = trainer.full_parameter(name);
      if (context.rank == 0) result.params[name] = std::move(value);
    }
    GlobalBatch held_out = make_batch(spec.model, 1000, spec.rows);
    const float evaluation = trainer.evaluate(held_out.rows_of(first, local));
    if (context.rank == 0) result.evaluation = evaluation;
    if (spec.after_training) spec.after_training(context.rank, trainer);
  });
  return result;
}

// The tolerance of the engine's parity tests: 1e-6 relative, plus 1e-7 absolute for values
// near zero (the runs differ only in the order fp32 sums are taken).
constexpr double kRelative = 1e-6;
constexpr double kAbsolute = 1e-7;

// The largest |a - b| / (1e-6 |a| + 1e-7) over losses and parameters: <= 1 is parity.
inline double worst_relative_difference(const TrainResult& a, const TrainResult& b,
                                        std::string* where = nullptr) {
  double worst = 0.0;
  const auto compare = [&](float x, float y, const std::string& what) {
    const double ratio =
        std::abs(double{x} - double{y}) / (kRelative * std::abs(double{x}) + kAbsolute);
    if (!(ratio <= worst)) {
      worst = std::isnan(ratio) ? 1e30 : ratio;
      if (where) *where = what + ": " + std::to_string(x) + " vs " + std::to_string(y);
    }
  };
  if (a.losses.size() != b.losses.size() || a.params.size() != b.params.size()) return 1e30;
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    compare(a.losses[i], b.losses[i], "loss of step " + std::to_string(i + 1));
  }
  compare(a.evaluation, b.evaluation, "evaluation loss");
  for (std::size_t i = 0; i < a.grad_norms.size() && i < b.grad_norms.size(); ++i) {
    compare(a.grad_norms[i], b.grad_norms[i], "gradient norm of step " + std::to_string(i + 1));
  }
  for (const auto& [name, value] : a.params) {
    const auto other = b.params.find(name);
    if (other == b.params.end() || other->second.size() != value.size()) return 1e30;
    for (std::size_t i = 0; i < value.size(); ++i) {
      compare(value[i], other->second[i], name + "[" + std::to_string(i) + "]");
    }
  }
  return worst;
}

}  // namespace zest::testing
