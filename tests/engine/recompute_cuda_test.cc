// ctest-labels: gpu
// Activation recomputation on the CUDA device: the GPT with full and selective recomputation and
// with the kept inputs offloaded to pinned host memory (the checkpoint copy stream) ends with
// the same losses and parameters, bit for bit, as the same run on the GPU without them, at
// stages 0 and 3, fp32 and bf16, on one GPU (and two where two are visible). The CUDA kernels
// are deterministic for a fixed shape, so any difference is a bug of the recomputation, as on
// the CPU (tests/engine/recompute_test.cc). Skips, saying why, where no GPU is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "engine/engine.h"
#include "engine/recompute.h"
#include "models/gpt.h"
#include "optim/optimizer.h"
#include "runtime/world.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

const GptConfig kGpt{/*n_layer=*/3, /*n_head=*/2, /*n_embd=*/64, /*vocab_size=*/97,
                     /*seq_len=*/16};
constexpr int kGlobalSequences = 8;
constexpr int kSteps = 3;

struct Job {
  int stage = 0;
  int world = 1;
  DType dtype = DType::kFloat32;
  ActivationCheckpointing checkpointing;
};

struct Training {
  std::vector<float> losses;
  std::map<std::string, std::vector<float>> params;
};

Training run_gpt_on_gpus(const Job& job) {
  Training result;
  result.losses.resize(kSteps);
  WorldOptions world_options;
  world_options.ranks = job.world;
  world_options.device = DeviceKind::kCuda;
  world_options.backend = "nccl";
  world_options.timeout = std::chrono::seconds(120);
  World(world_options).run([&](RankContext& context) {
    Gpt model(kGpt);
    EngineOptions options;
    options.stage = job.stage;
    options.compute_dtype = job.dtype;
    options.communication_dtype = job.dtype;
    options.activation_checkpointing = job.checkpointing;
    Engine engine(context, options);
    OptimizerOptions optimizer;
    optimizer.lr = 3e-3f;
    auto trainer = engine.shard(model, make_optimizer(optimizer));
    const std::int64_t rows = kGlobalSequences / job.world;
    const std::int64_t seq = kGpt.seq_len;
    for (int step = 0; step < kSteps; ++step) {
      std::mt19937 rng(700 + step);
      std::uniform_int_distribution<std::int32_t> token(0, kGpt.vocab_size - 1);
      std::vector<std::int32_t> inputs(kGlobalSequences * seq), targets(inputs.size());
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        inputs[i] = token(rng);
        targets[i] = (5 * inputs[i] + 2) % kGpt.vocab_size;
      }
      const std::size_t first = static_cast<std::size_t>(context.rank * rows * seq);
      Batch batch{Tensor{inputs.data() + first, {rows, seq}, DType::kInt32},
                  Tensor{targets.data() + first, {rows, seq}, DType::kInt32}};
      trainer->forward_backward(batch);
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

ActivationCheckpointing policy(RecomputePolicy kind, bool cpu = false) {
  ActivationCheckpointing options;
  options.policy = kind;
  options.cpu_checkpointing = cpu;
  return options;
}

TEST(RecomputeCuda, EveryPolicyChangesNoBitOnTheGpu) {
  ZEST_SKIP_WITHOUT_CUDA();
  const int gpus = cuda::visible_devices().count;
  for (const int world : {1, 2}) {
    if (world > gpus) continue;
    for (const int stage : {0, 3}) {
      for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        Job plain{stage, world, dtype, policy(RecomputePolicy::kNone)};
        const Training want = run_gpt_on_gpus(plain);
        for (const auto& [name, checkpointing] :
             {std::pair{"full", policy(RecomputePolicy::kFull)},
              std::pair{"selective", policy(RecomputePolicy::kSelective)},
              std::pair{"full + cpu_checkpointing", policy(RecomputePolicy::kFull, true)}}) {
          SCOPED_TRACE(std::string(name) + ", stage " + std::to_string(stage) + ", world " +
                       std::to_string(world) + ", " + dtype_name(dtype));
          Job job = plain;
          job.checkpointing = checkpointing;
          const Training got = run_gpt_on_gpus(job);
          EXPECT_EQ(got.losses, want.losses);
          for (const auto& [param, values] : want.params) {
            EXPECT_EQ(got.params.at(param), values) << param;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace zest
