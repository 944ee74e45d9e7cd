// What the recomputation suites share (tests/engine/recompute_test.cc on the CPU device,
// recompute_cuda_test.cc on GPUs): the GPT on a fixed token task, trained with the engine's
// options of a Job, and the bit-for-bit comparison of two trainings.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/recompute.h"
#include "models/gpt.h"
#include "optim/optimizer.h"
#include "runtime/world.h"

namespace zest::testing {

inline const GptConfig kGpt{/*n_layer=*/3, /*n_head=*/2, /*n_embd=*/16, /*vocab_size=*/37,
                     /*seq_len=*/8};
constexpr int kGlobalSequences = 8;  // divides by 1, 2 and 4 ranks times 2 micro-batches
constexpr int kSteps = 4;

struct Job {
  int stage = 0;
  int world = 1;
  DType dtype = DType::kFloat32;
  int accumulation = 1;
  ActivationCheckpointing checkpointing;
  bool offload_optimizer = false;
  // A vocabulary whose embedding outgrows a block puts it in a gather-ring size class of its
  // own, where stage 3 keeps its gradient in its gather slot (Unit::gradients_replace_parameters).
  int vocab_size = kGpt.vocab_size;
  // The CUDA device runs the ranks with the nccl backend, one GPU each.
  DeviceKind device = DeviceKind::kCpu;
  // zero_optimization.offload_param "cpu" (stage 3). Last: suites initialize the fields above
  // in order.
  bool offload_param = false;
  // Any other engine options, set last (offload_param "nvme" and its buffers, say).
  std::function<void(EngineOptions&)> configure_engine = {};
};

inline ActivationCheckpointing policy(RecomputePolicy kind, bool cpu = false) {
  ActivationCheckpointing options;
  options.policy = kind;
  options.cpu_checkpointing = cpu;
  return options;
}

struct Training {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
};

// The GPT on a fixed token task; sequences dealt rank-major within each micro-batch.
inline Training run_gpt(const Job& job) {
  Training result;
  result.losses.resize(kSteps);
  WorldOptions world_options;
  world_options.ranks = job.world;
  world_options.timeout = std::chrono::seconds(60);
  if (job.device == DeviceKind::kCuda) {
    world_options.device = DeviceKind::kCuda;
    world_options.backend = "nccl";
  }
  World(world_options).run([&](RankContext& context) {
    GptConfig config = kGpt;
    config.vocab_size = job.vocab_size;
    Gpt model(config);
    EngineOptions options;
    options.stage = job.stage;
    options.compute_dtype = job.dtype;
    options.communication_dtype = job.dtype;
    options.gradient_accumulation_steps = job.accumulation;
    options.activation_checkpointing = job.checkpointing;
    if (job.offload_optimizer) options.offload_optimizer.device = OffloadDevice::kCpu;
    if (job.offload_param) options.offload_param.device = OffloadDevice::kCpu;
    if (job.configure_engine) job.configure_engine(options);
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.lr = 3e-3f;
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    const std::int64_t rows = kGlobalSequences / job.world / job.accumulation;
    const std::int64_t seq = kGpt.seq_len;
    for (int step = 0; step < kSteps; ++step) {
      std::mt19937 rng(500 + step);
      std::uniform_int_distribution<std::int32_t> token(0, job.vocab_size - 1);
      std::vector<std::int32_t> inputs(kGlobalSequences * seq), targets(inputs.size());
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = token(rng);
        targets[i] = (3 * inputs[i] + 1) % job.vocab_size;
      }
      for (int micro = 0; micro < job.accumulation; ++micro) {
        const std::size_t first =
            static_cast<std::size_t>((micro * job.world + context.rank) * rows * seq);
        Batch batch{Tensor{inputs.data() + first, {rows, seq}, DType::kInt32},
                    Tensor{targets.data() + first, {rows, seq}, DType::kInt32}};
        trainer->forward_backward(batch);
      }
      const StepStats stats = trainer->step();
      if (context.rank == 0) result.losses[step] = stats.loss;
    }
    for (const std::string& name : trainer->parameter_names()) {
      std::vector<float> value = trainer->full_parameter(name);
      if (context.rank == 0) result.params[name] = std::move(value);
    }
  });
  return result;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void expect_bit_identical(const Training& expected, const Training& run) {
  EXPECT_TRUE(same_bits(expected.losses, run.losses))
      << "first loss " << expected.losses.front() << " vs " << run.losses.front() << ", last "
      << expected.losses.back() << " vs " << run.losses.back();
  ASSERT_EQ(expected.params.size(), run.params.size());
  for (const auto& [name, values] : expected.params) {
    EXPECT_TRUE(same_bits(values, run.params.at(name))) << name;
  }
  // Training must have moved for the comparison to mean anything.
  EXPECT_NE(expected.losses.front(), expected.losses.back());
}

inline std::string describe(const Job& job) {
  return "stage " + std::to_string(job.stage) + ", " + std::to_string(job.world) + " ranks, " +
         dtype_name(job.dtype) + ", " + std::to_string(job.accumulation) + " micro-batches, " +
         recompute_policy_name(job.checkpointing.policy) +
         (job.checkpointing.cpu_checkpointing ? " offloaded" : "");
}

}  // namespace zest::testing
