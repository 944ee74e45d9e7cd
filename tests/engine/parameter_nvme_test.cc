// zero_optimization.offload_param "nvme" (stage 3): each rank's parameter shards live in swap
// files, are read through a few host buffers ahead of the gather ring and written back after the
// optimizer's update. Training is the same bits as with the shards on the device ("none", the
// reference) and in host memory ("cpu"), on io_uring and on the pread/pwrite threads, at worlds
// 1-4, fp32 and bf16, with gradient accumulation and recomputation, with the optimizer on the
// device or on NVMe too; the host holds the buffers, the swap files what was planned;
// checkpoints move between nvme, cpu and none and to another world size; a failed read or
// write names the file and the offset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "models/mlp.h"
#include "planner/peak_plan.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/swap_file_bytes.h"
#include "tests/engine/recompute_test_support.h"

namespace zest {
namespace {

namespace fs = std::filesystem;
using testing::run_mlp;
using testing::RunResult;
using testing::RunSpec;
using testing::same_bits;
using testing::ScratchDirectory;
using testing::train_mlp;
using testing::TrainResult;
using testing::TrainSpec;

enum class Where { kNone, kCpu, kNvme, kNvmeThreads };

// Two host buffers of 64 elements and one-block requests, so that a shard moves in several
// pieces, buffers are reused within a unit, and reads and writes share them.
std::function<void(EngineOptions&)> parameters_on(Where where, const std::string& nvme_path,
                                                  SwapFault fault = {},
                                                  bool optimizer_on_nvme = false) {
  return [=](EngineOptions& options) {
    if (optimizer_on_nvme) {
      options.offload_optimizer.device = OffloadDevice::kNvme;
      options.offload_optimizer.nvme_path = nvme_path;
      options.offload_optimizer.buffer_count = 2;
      options.offload_optimizer.sub_group_size = 100;
    }
    options.aio.block_size = 4096;
    options.aio.io.backend =
        where == Where::kNvmeThreads ? SwapBackend::kThreads : SwapBackend::kIoUring;
    options.aio.io.thread_count = 2;
    options.aio.io.fault = fault;
    if (where == Where::kNone) return;
    options.offload_param.device =
        where == Where::kCpu ? OffloadDevice::kCpu : OffloadDevice::kNvme;
    options.offload_param.nvme_path = nvme_path;
    options.offload_param.buffer_count = 2;
    options.offload_param.buffer_size = 64;
    options.offload_param.max_in_cpu = 0;
  };
}

bool same_training(const RunResult& a, const RunResult& b) {
  if (!same_bits(a.losses, b.losses)) return false;
  for (const auto& [name, values] : a.params) {
    if (!same_bits(values, b.params.at(name))) return false;
  }
  return true;
}

bool swap_left(const std::string& nvme_path) {
  return fs::exists(fs::path(nvme_path) / "zest-swap");
}

// ---------------------------------------------------------------------------------------------
// Parity: none, cpu, nvme (io_uring) and nvme (threads) are the same bits.

using ParityCase = std::tuple<int, DType, bool>;  // world, compute dtype, optimizer on NVMe

class ParameterNvmeParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(ParameterNvmeParity, LossesAndParametersAreTheBitsOfNoneAndCpu) {
  const auto [world, dtype, optimizer_on_nvme] = GetParam();
  ScratchDirectory scratch;
  const std::string nvme = scratch.path("nvme");
  RunSpec spec;
  spec.stage = 3;
  spec.world = world;
  spec.steps = 8;
  spec.sizes = {13, 131, 17, 7};  // a 131 x 13 layer: a shard of several 64-element pieces
  spec.compute_dtype = dtype;
  spec.clipping = 1.0f;
  spec.configure_engine = parameters_on(Where::kNone, nvme, {}, optimizer_on_nvme);
  const RunResult none = run_mlp(spec);
  spec.configure_engine = parameters_on(Where::kCpu, nvme, {}, optimizer_on_nvme);
  const RunResult cpu = run_mlp(spec);
  spec.configure_engine = parameters_on(Where::kNvme, nvme, {}, optimizer_on_nvme);
  const RunResult on_nvme = run_mlp(spec);
  spec.configure_engine = parameters_on(Where::kNvmeThreads, nvme, {}, optimizer_on_nvme);
  const RunResult threads = run_mlp(spec);
  EXPECT_TRUE(same_training(none, cpu));
  EXPECT_TRUE(same_training(none, on_nvme));
  EXPECT_TRUE(same_training(on_nvme, threads));        // the pread/pwrite fallback
  EXPECT_LT(none.losses.back(), none.losses.front());  // it trained
  EXPECT_FALSE(swap_left(nvme));
}

INSTANTIATE_TEST_SUITE_P(WorldsDtypesOptimizer, ParameterNvmeParity,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  dtype_name(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_optimizer_on_nvme" : "");
                         });

// The GPT: the tied head borrows the embedding, accumulation, recomputation.
struct GptCase {
  int world;
  DType dtype;
  int accumulation;
  RecomputePolicy recompute;
  bool optimizer_on_nvme;
};

class ParameterNvmeGpt : public ::testing::TestWithParam<GptCase> {};

TEST_P(ParameterNvmeGpt, RecomputedAccumulatedTrainingIsTheSameBits) {
  const GptCase c = GetParam();
  ScratchDirectory scratch;
  testing::Job job;
  job.stage = 3;
  job.world = c.world;
  job.dtype = c.dtype;
  job.accumulation = c.accumulation;
  job.checkpointing = testing::policy(c.recompute);
  job.configure_engine = parameters_on(Where::kNone, scratch.path("nvme"), {}, c.optimizer_on_nvme);
  SCOPED_TRACE(testing::describe(job));
  const testing::Training reference = testing::run_gpt(job);
  job.configure_engine = parameters_on(Where::kNvme, scratch.path("nvme"), {}, c.optimizer_on_nvme);
  testing::expect_bit_identical(reference, testing::run_gpt(job));
  EXPECT_FALSE(swap_left(scratch.path("nvme")));
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, ParameterNvmeGpt,
    ::testing::Values(GptCase{1, DType::kFloat32, 2, RecomputePolicy::kFull, false},
                      GptCase{2, DType::kBFloat16, 2, RecomputePolicy::kFull, true},
                      GptCase{4, DType::kFloat32, 2, RecomputePolicy::kSelective, true},
                      GptCase{3, DType::kBFloat16, 1, RecomputePolicy::kNone, false}),
    [](const auto& info) {
      const GptCase& c = info.param;
      return "world" + std::to_string(c.world) + "_" + dtype_name(c.dtype) + "_accumulation" +
             std::to_string(c.accumulation) + "_" + recompute_policy_name(c.recompute) +
             (c.optimizer_on_nvme ? "_optimizer_on_nvme" : "");
    });

// max_in_cpu: units in order stay in host memory while their shards fit in what is left of it;
// the others go to NVMe.
TEST(ParameterNvmeMaxInCpu, UnitsThatFitStayInHostMemoryWithTheSameBits) {
  ScratchDirectory scratch;
  RunSpec spec;
  spec.stage = 3;
  spec.world = 2;
  spec.steps = 4;
  spec.sizes = {64, 128, 96, 10};
  spec.compute_dtype = DType::kBFloat16;
  const RunResult none = run_mlp(spec);
  std::size_t swap_bytes = 0;
  spec.after_step = [&](int rank, int, const StepStats&, Trainer& trainer) {
    if (rank == 0) swap_bytes = trainer.swap_bytes();
  };
  spec.configure_engine = [&](EngineOptions& options) {
    parameters_on(Where::kNvme, scratch.path("nvme"))(options);
    options.offload_param.max_in_cpu = 5000;
  };
  const RunResult mixed = run_mlp(spec);
  EXPECT_TRUE(same_training(none, mixed));
  // Flat lengths padded to 2 x 32 elements, halved: unit 0 (64 x 128 + 128) a 4160-element
  // shard, kept; unit 1 (128 x 96 + 96) 6208, past the 840 left, to NVMe; unit 2 (96 x 10 + 10)
  // 512, kept. bf16: 2 bytes each.
  const std::size_t kept = (4160 + 512) * 2;
  const std::size_t buffers = 2 * (4096 + 4096);  // two one-block buffers, each a block more
  EXPECT_EQ(mixed.host_usage[0].current_of(Category::kParams), kept + buffers);
  EXPECT_EQ(mixed.predicted[0].host_params, kept + buffers);
  EXPECT_EQ(swap_bytes, (6208 * 2 + 4095) / 4096 * 4096);  // unit 1, in whole blocks
  EXPECT_EQ(mixed.predicted[0].nvme, swap_bytes);
}

// ---------------------------------------------------------------------------------------------
// Memory: no shard on the device or in the host, the swap files as planned, by the planner too.

TEST(ParameterNvmeMemory, TheHostHoldsTheBuffersAndTheSwapIsThePlansExactly) {
  ScratchDirectory scratch;
  RunSpec spec;
  spec.stage = 3;
  spec.world = 2;
  spec.steps = 2;
  spec.sizes = {64, 128, 96, 10};
  spec.compute_dtype = DType::kBFloat16;
  spec.configure_engine = parameters_on(Where::kNvme, scratch.path("nvme"));
  std::vector<std::size_t> swap_bytes(2), file_bytes(2);
  spec.after_step = [&](int rank, int, const StepStats&, Trainer& trainer) {
    swap_bytes[rank] = trainer.swap_bytes();
    file_bytes[rank] = testing::swap_file_bytes(scratch.path("nvme"), rank);
  };
  const RunResult run = run_mlp(spec);
  const std::size_t buffers = 2 * (4096 + 4096);  // 64 bf16 elements in a block, one more each
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_GT(swap_bytes[rank], 0u);
    EXPECT_EQ(file_bytes[rank], swap_bytes[rank]);
    EXPECT_EQ(run.predicted[rank].nvme, swap_bytes[rank]);
    EXPECT_EQ(run.predicted[rank].nvme_params, swap_bytes[rank]);
    EXPECT_EQ(run.usage[rank].peak_of(Category::kParams), 0u);
    EXPECT_EQ(run.host_usage[rank].peak_of(Category::kParams), buffers);
    EXPECT_EQ(run.predicted[rank].host_params, buffers);
  }
  EngineOptions options;
  options.stage = spec.stage;
  options.compute_dtype = spec.compute_dtype;
  options.communication_dtype = spec.compute_dtype;
  spec.configure_engine(options);
  Mlp model(MlpConfig{spec.sizes});
  const PeakPrediction plan = predict_peak(plan_input(
      model, {spec.global_batch / spec.world, spec.sizes.front()}, options, 2, spec.world));
  EXPECT_EQ(plan.nvme_of(Category::kParams), swap_bytes[0]);
  EXPECT_EQ(plan.nvme_of(Category::kOptimizer), 0u);
  EXPECT_EQ(plan.host_of(Category::kParams), run.host_usage[0].peak_of(Category::kParams));
  EXPECT_EQ(plan.of(Category::kParams), 0u);
  EXPECT_FALSE(swap_left(scratch.path("nvme")));  // the plan made no folder either
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: the same files wherever the shards lived.

struct CheckpointCase {
  Where saved, resumed;
  DType dtype;
  bool optimizer_on_nvme;
};

class ParameterNvmeCheckpoint : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(ParameterNvmeCheckpoint, ResumesAtAnyPlacementAsTheUninterruptedRun) {
  const CheckpointCase c = GetParam();
  ScratchDirectory scratch;
  const std::string nvme = scratch.path("nvme");
  TrainSpec reference_spec;
  reference_spec.world = 2;
  reference_spec.stage = 3;
  reference_spec.compute_dtype = c.dtype;
  reference_spec.configure_engine = parameters_on(c.resumed, nvme, {}, c.optimizer_on_nvme);
  const TrainResult reference = train_mlp(reference_spec);

  TrainSpec first = reference_spec;
  first.configure_engine = parameters_on(c.saved, nvme, {}, c.optimizer_on_nvme);
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  train_mlp(first);

  TrainSpec second = reference_spec;
  second.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(second);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (const auto& [step, loss] : resumed.losses)
    EXPECT_EQ(loss, reference.losses.at(step)) << step;
  for (const auto& [name, values] : reference.params) {
    EXPECT_TRUE(same_bits(values, resumed.params.at(name))) << name;
  }
  EXPECT_FALSE(swap_left(nvme));
}

const char* where_name(Where where) {
  switch (where) {
    case Where::kNone:
      return "none";
    case Where::kCpu:
      return "cpu";
    default:
      return "nvme";
  }
}

INSTANTIATE_TEST_SUITE_P(
    SavesAndLoads, ParameterNvmeCheckpoint,
    ::testing::Values(CheckpointCase{Where::kNvme, Where::kNone, DType::kFloat32, false},
                      CheckpointCase{Where::kNone, Where::kNvme, DType::kFloat32, false},
                      CheckpointCase{Where::kNvme, Where::kCpu, DType::kBFloat16, false},
                      CheckpointCase{Where::kCpu, Where::kNvme, DType::kBFloat16, true},
                      CheckpointCase{Where::kNvme, Where::kNvme, DType::kFloat32, true}),
    [](const auto& info) {
      const CheckpointCase& c = info.param;
      return std::string(where_name(c.saved)) + "_to_" + where_name(c.resumed) + "_" +
             dtype_name(c.dtype) + (c.optimizer_on_nvme ? "_optimizer_on_nvme" : "");
    });

// Saved at 2 ranks with the shards on NVMe, resumed at 4: the same bits as the resume at 4 with
// the shards on the device (a run at another world size sums in another order, so the resumed
// runs are compared with each other).
TEST(ParameterNvmeCheckpointWorlds, ResumesAtAnotherWorldSizeAsWithoutTheTier) {
  ScratchDirectory scratch;
  const std::string nvme = scratch.path("nvme");
  TrainSpec first;
  first.world = 2;
  first.stage = 3;
  first.compute_dtype = DType::kBFloat16;
  first.configure_engine = parameters_on(Where::kNvme, nvme);
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  train_mlp(first);
  TrainSpec second;
  second.world = 4;
  second.stage = 3;
  second.compute_dtype = DType::kBFloat16;
  second.resume = scratch.path("ckpt");
  second.configure_engine = parameters_on(Where::kNone, nvme);
  const TrainResult plain = train_mlp(second);
  second.configure_engine = parameters_on(Where::kNvme, nvme);
  const TrainResult swapped = train_mlp(second);
  EXPECT_TRUE(swapped.loaded.resharded);
  ASSERT_EQ(swapped.losses.size(), 3u);
  for (const auto& [step, loss] : swapped.losses) EXPECT_EQ(loss, plain.losses.at(step)) << step;
  for (const auto& [name, values] : plain.params) {
    EXPECT_TRUE(same_bits(values, swapped.params.at(name))) << name;
  }
}

// ---------------------------------------------------------------------------------------------
// Failures: one error naming the file and the offset; the swap folder goes.

class ParameterNvmeFailure : public ::testing::TestWithParam<SwapFaultKind> {};

TEST_P(ParameterNvmeFailure, MidRunFailureNamesFileAndOffset) {
  ScratchDirectory scratch;
  RunSpec spec;
  spec.stage = 3;
  spec.world = 2;
  spec.steps = 4;
  spec.compute_dtype = DType::kBFloat16;
  // Well into the run: each step reads every shard's blocks twice (forward and backward) and
  // writes them once; the first writes are the initial values.
  const SwapFault fault{GetParam(), 12};
  spec.configure_engine = parameters_on(Where::kNvme, scratch.path("nvme"), fault);
  std::string message;
  try {
    run_mlp(spec);
  } catch (const Error& error) {
    message = error.what();
  }
  ASSERT_FALSE(message.empty()) << "the injected failure stopped nothing";
  EXPECT_NE(message.find("swap file '" + scratch.path("nvme")), std::string::npos) << message;
  EXPECT_NE(message.find(" at offset "), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_FALSE(swap_left(scratch.path("nvme")));
}

INSTANTIATE_TEST_SUITE_P(Kinds, ParameterNvmeFailure,
                         ::testing::Values(SwapFaultKind::kIoError, SwapFaultKind::kShortRead,
                                           SwapFaultKind::kNoSpace),
                         [](const auto& info) {
                           switch (info.param) {
                             case SwapFaultKind::kIoError:
                               return std::string("eio");
                             case SwapFaultKind::kShortRead:
                               return std::string("short_read");
                             default:
                               return std::string("enospc");
                           }
                         });

TEST(ParameterNvmeConfig, NvmeWithoutAPathIsAConfigErrorNamingTheKey) {
  RunSpec spec;
  spec.stage = 3;
  spec.steps = 1;
  spec.configure_engine = [](EngineOptions& options) {
    options.offload_param.device = OffloadDevice::kNvme;
  };
  try {
    run_mlp(spec);
    FAIL() << "expected a config error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(error.what()).find("offload_param.nvme_path"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace zest
