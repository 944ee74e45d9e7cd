// offload_optimizer.device "nvme": master weights and moments live in swap files and stream
// through a few host buffers a sub-group at a time. Training is the same bits as with the state
// on the host ("cpu") and on the device ("none"), on io_uring and on the pread/pwrite threads;
// the host holds buffer_count sub-groups, the swap files exactly what was planned; checkpoints
// move between nvme, cpu and none; a failed read or write is one error naming the file and the
// offset, the last checkpoint stays good, and no swap folder is left behind.
#include <gtest/gtest.h>

#include <sys/mount.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "engine/zero_trainer.h"
#include "models/mlp.h"
#include "planner/peak_plan.h"
#include "tests/checkpoint/checkpoint_test_support.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/swap_file_bytes.h"

namespace zest {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::RunSpec;
using testing::ScratchDirectory;
using testing::TrainResult;
using testing::TrainSpec;
using testing::run_mlp;
using testing::train_mlp;

enum class Where { kNone, kCpu, kNvme, kNvmeThreads };

// Small sub-groups, two host buffers and one-block requests, so that a unit's shard is cut into
// several sub-groups, buffers are reused within a step, and a sub-group is several requests.
std::function<void(EngineOptions&)> state_on(Where where, const std::string& nvme_path,
                                             SwapFault fault = {}) {
  return [=](EngineOptions& options) {
    if (where == Where::kNone) return;
    options.offload_optimizer.device = where == Where::kCpu ? OffloadDevice::kCpu : OffloadDevice::kNvme;
    options.offload_optimizer.nvme_path = nvme_path;
    options.offload_optimizer.buffer_count = 2;
    options.offload_optimizer.sub_group_size = 100;
    options.aio.block_size = 4096;
    options.aio.io.backend = where == Where::kNvmeThreads ? SwapBackend::kThreads : SwapBackend::kIoUring;
    options.aio.io.thread_count = 2;
    options.aio.io.fault = fault;
  };
}

bool same_bits(const RunResult& a, const RunResult& b) {
  if (a.losses.size() != b.losses.size()) return false;
  if (std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)) != 0) return false;
  for (const auto& [name, values] : a.params) {
    const std::vector<float>& other = b.params.at(name);
    if (values.size() != other.size() ||
        std::memcmp(values.data(), other.data(), values.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

bool swap_left(const std::string& nvme_path) { return fs::exists(fs::path(nvme_path) / "zest-swap"); }

using ParityCase = std::tuple<int, int, DType>;  // stage, world, compute dtype

class NvmeParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(NvmeParity, LossesAndParametersAreTheBitsOfCpuAndNoOffload) {
  const auto [stage, world, dtype] = GetParam();
  ScratchDirectory scratch;
  RunSpec spec;
  spec.stage = stage;
  spec.world = world;
  spec.steps = 12;
  spec.compute_dtype = dtype;
  spec.clipping = 1.0f;
  spec.configure_engine = state_on(Where::kNone, "");
  const RunResult none = run_mlp(spec);
  spec.configure_engine = state_on(Where::kCpu, "");
  const RunResult cpu = run_mlp(spec);
  spec.configure_engine = state_on(Where::kNvme, scratch.path("nvme"));
  const RunResult nvme = run_mlp(spec);
  spec.configure_engine = state_on(Where::kNvmeThreads, scratch.path("nvme"));
  const RunResult threads = run_mlp(spec);
  EXPECT_TRUE(same_bits(none, cpu));
  EXPECT_TRUE(same_bits(cpu, nvme));
  EXPECT_TRUE(same_bits(nvme, threads));  // the pread/pwrite fallback
  EXPECT_LT(none.losses.back(), none.losses.front());  // it trained
  EXPECT_FALSE(swap_left(scratch.path("nvme")));
}

INSTANTIATE_TEST_SUITE_P(
    StagesWorldsDtypes, NvmeParity,
    ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(1, 2, 4),
                       ::testing::Values(DType::kFloat32, DType::kBFloat16)),
    [](const auto& info) {
      return "stage" + std::to_string(std::get<0>(info.param)) + "_world" +
             std::to_string(std::get<1>(info.param)) + "_" + dtype_name(std::get<2>(info.param));
    });

TEST(NvmeParityMore, AccumulationAndRecomputationMatch) {
  ScratchDirectory scratch;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(dtype_name(dtype));
    RunSpec spec;
    spec.stage = 3;
    spec.world = 2;
    spec.steps = 4;
    spec.accumulation = 3;
    spec.compute_dtype = dtype;
    auto with_recompute = [&](Where where) {
      return [base = state_on(where, scratch.path("nvme"))](EngineOptions& options) {
        base(options);
        options.activation_checkpointing.policy = RecomputePolicy::kFull;
      };
    };
    spec.configure_engine = with_recompute(Where::kNone);
    const RunResult none = run_mlp(spec);
    spec.configure_engine = with_recompute(Where::kNvme);
    const RunResult nvme = run_mlp(spec);
    EXPECT_TRUE(same_bits(none, nvme));
  }
}

TEST(NvmeMemory, HostHoldsBufferCountSubGroupsAndTheSwapIsAsPlanned) {
  ScratchDirectory scratch;
  RunSpec spec;
  spec.stage = 2;
  spec.world = 2;
  spec.steps = 2;
  spec.sizes = {64, 128, 96, 10};
  spec.compute_dtype = DType::kBFloat16;
  std::vector<std::size_t> swap_bytes(2), file_bytes(2);
  std::vector<std::size_t> shard_elements(2), largest_shard(2);
  spec.after_step = [&](int rank, int, const StepStats&, Trainer& trainer) {
    swap_bytes[rank] = trainer.swap_bytes();
    file_bytes[rank] = testing::swap_file_bytes(scratch.path("nvme"), rank);
    shard_elements[rank] = 0;
    for (const ShardLayout& layout : trainer.layouts()) {
      shard_elements[rank] += layout.shard_length();
      largest_shard[rank] = std::max(largest_shard[rank], layout.shard_length());
    }
  };
  spec.configure_engine = state_on(Where::kNvme, scratch.path("nvme"));
  const RunResult nvme = run_mlp(spec);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const MemoryPrediction& predicted = nvme.predicted[rank];
    EXPECT_GT(swap_bytes[rank], 0u);
    EXPECT_EQ(file_bytes[rank], swap_bytes[rank]);  // the files are the plan's size
    EXPECT_EQ(predicted.nvme, swap_bytes[rank]);
    // The whole state (master + two moments) is far more than the host keeps of it.
    const std::size_t state = shard_elements[rank] * sizeof(float) * 3;
    EXPECT_GE(swap_bytes[rank], state);
    EXPECT_EQ(predicted.offload, nvme.host_usage[rank].current_of(Category::kOffload));
    EXPECT_EQ(nvme.usage[rank].peak_of(Category::kOptimizer), 0u);
    // Two buffers of one sub-group (100 elements, three tensors of 4096 bytes each) + the page
    // each is aligned with; the transfer shard (bf16) and the fp32 widening of the largest shard.
    const std::size_t buffers = 2 * (3 * 4096 + 4096);
    EXPECT_EQ(nvme.host_usage[rank].current_of(Category::kOffload),
              buffers + shard_elements[rank] * 2 + largest_shard[rank] * sizeof(float));
    EXPECT_LT(buffers, state);
  }
}

// The planner runs the engine on the shape-only device, whose swap store reserves and writes
// nothing: its NVMe bytes are the real files' size, its host peak the host arena's.
TEST(NvmePlan, PlannedSwapAndHostBytesAreTheRunsExactly) {
  ScratchDirectory scratch;
  RunSpec spec;
  spec.stage = 3;
  spec.world = 2;
  spec.steps = 2;
  spec.sizes = {64, 128, 96, 10};
  spec.compute_dtype = DType::kBFloat16;
  spec.configure_engine = state_on(Where::kNvme, scratch.path("nvme"));
  std::size_t swap_bytes = 0;
  spec.after_step = [&](int rank, int, const StepStats&, Trainer& trainer) {
    if (rank == 0) swap_bytes = trainer.swap_bytes();
  };
  const RunResult run = run_mlp(spec);
  EngineOptions options;
  options.stage = spec.stage;
  options.compute_dtype = spec.compute_dtype;
  options.communication_dtype = spec.compute_dtype;
  spec.configure_engine(options);
  Mlp model(MlpConfig{spec.sizes});
  const PeakPrediction plan = predict_peak(plan_input(
      model, {spec.global_batch / spec.world, spec.sizes.front()}, options, 2, spec.world));
  EXPECT_GT(plan.nvme_total(), 0u);
  EXPECT_EQ(plan.nvme_of(Category::kOptimizer), swap_bytes);
  EXPECT_EQ(plan.model_state.nvme, swap_bytes);
  EXPECT_EQ(plan.of(Category::kOffload), run.host_usage[0].peak_of(Category::kOffload));
  EXPECT_FALSE(swap_left(scratch.path("nvme")));  // the plan made no folder either
  // The CUDA device's plan (still a replay of the engine's order on the device) holds the same
  // swap files and host buffers: the engine lays them out alike on either device.
  PeakPlanInput on_cuda = plan_input(model, {spec.global_batch / spec.world, spec.sizes.front()},
                                     options, 2, spec.world);
  on_cuda.device = DeviceKind::kCuda;
  const PeakPrediction cuda = predict_peak(on_cuda);
  EXPECT_EQ(cuda.nvme, plan.nvme);
  EXPECT_EQ(cuda.model_state.nvme, swap_bytes);
  EXPECT_EQ(cuda.host_peak_total, plan.host_peak_total);
  EXPECT_EQ(cuda.of(Category::kOffload), plan.of(Category::kOffload));
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: the same files at every placement of the state.

struct CheckpointCase {
  Where saved, resumed;
  int world, stage;
  DType dtype;
};

class NvmeCheckpoint : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(NvmeCheckpoint, ResumesAtAnyPlacementAsTheUninterruptedRun) {
  const CheckpointCase c = GetParam();
  ScratchDirectory scratch;
  TrainSpec reference_spec;
  reference_spec.world = c.world;
  reference_spec.stage = c.stage;
  reference_spec.compute_dtype = c.dtype;
  reference_spec.configure_engine = state_on(c.resumed, scratch.path("nvme"));
  const TrainResult reference = train_mlp(reference_spec);

  TrainSpec first = reference_spec;
  first.configure_engine = state_on(c.saved, scratch.path("nvme"));
  first.steps = 3;
  first.save_dir = scratch.path("ckpt");
  first.save_at = 3;
  train_mlp(first);

  TrainSpec second = reference_spec;
  second.resume = scratch.path("ckpt");
  const TrainResult resumed = train_mlp(second);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (const auto& [step, loss] : resumed.losses) EXPECT_EQ(loss, reference.losses.at(step)) << step;
  for (const auto& [name, values] : reference.params) {
    const std::vector<float>& other = resumed.params.at(name);
    ASSERT_EQ(values.size(), other.size()) << name;
    EXPECT_EQ(std::memcmp(values.data(), other.data(), values.size() * sizeof(float)), 0) << name;
  }
  EXPECT_FALSE(swap_left(scratch.path("nvme")));
}

const char* where_name(Where where) {
  switch (where) {
    case Where::kNone: return "none";
    case Where::kCpu: return "cpu";
    default: return "nvme";
  }
}

INSTANTIATE_TEST_SUITE_P(
    SavesAndLoads, NvmeCheckpoint,
    ::testing::Values(CheckpointCase{Where::kNvme, Where::kNone, 2, 2, DType::kFloat32},
                      CheckpointCase{Where::kNone, Where::kNvme, 2, 3, DType::kFloat32},
                      CheckpointCase{Where::kNvme, Where::kCpu, 2, 1, DType::kBFloat16},
                      CheckpointCase{Where::kCpu, Where::kNvme, 2, 3, DType::kBFloat16},
                      CheckpointCase{Where::kNvme, Where::kNvme, 1, 2, DType::kBFloat16}),
    [](const auto& info) {
      const CheckpointCase& c = info.param;
      return std::string(where_name(c.saved)) + "_to_" + where_name(c.resumed) + "_w" +
             std::to_string(c.world) + "s" + std::to_string(c.stage) + "_" + dtype_name(c.dtype);
    });

// ---------------------------------------------------------------------------------------------
// Failures: one error naming the file and the offset; the last checkpoint stays good; the swap
// folder goes.

class NvmeFailure : public ::testing::TestWithParam<SwapFaultKind> {};

TEST_P(NvmeFailure, MidRunFailureNamesFileAndOffsetAndTheLastCheckpointResumes) {
  ScratchDirectory scratch;
  TrainSpec spec;
  spec.world = 2;
  spec.stage = 2;
  spec.compute_dtype = DType::kBFloat16;
  spec.configure_engine = state_on(Where::kNvme, scratch.path("nvme"));
  const TrainResult reference = train_mlp(spec);

  // Each step reads and writes every sub-group once, in one-block requests; the fault comes
  // after three steps' worth (a checkpoint is saved after step 2, its reads counted too).
  TrainSpec failing = spec;
  failing.save_dir = scratch.path("ckpt");
  failing.save_at = 2;
  std::size_t requests_per_step = 0;
  {
    TrainSpec counting = spec;
    counting.steps = 1;
    counting.at_end = [&](RankContext& context, Trainer& trainer) {
      if (context.rank != 0) return;
      requests_per_step = trainer.swap_bytes() / 4096;  // one request per block
    };
    train_mlp(counting);
  }
  ASSERT_GT(requests_per_step, 0u);
  const SwapFault fault{GetParam(), 3 * requests_per_step};
  failing.configure_engine = state_on(Where::kNvme, scratch.path("nvme"), fault);
  std::string message;
  try {
    train_mlp(failing);
  } catch (const Error& error) {
    message = error.what();
  }
  ASSERT_FALSE(message.empty()) << "the injected failure stopped nothing";
  EXPECT_NE(message.find("swap file '" + scratch.path("nvme")), std::string::npos) << message;
  EXPECT_NE(message.find(" at offset "), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_FALSE(swap_left(scratch.path("nvme")));  // removed on the error too

  TrainSpec resumed = spec;
  resumed.resume = scratch.path("ckpt");
  const TrainResult after = train_mlp(resumed);
  for (const auto& [step, loss] : after.losses) EXPECT_EQ(loss, reference.losses.at(step)) << step;
}

INSTANTIATE_TEST_SUITE_P(Kinds, NvmeFailure,
                         ::testing::Values(SwapFaultKind::kIoError, SwapFaultKind::kShortRead,
                                           SwapFaultKind::kNoSpace),
                         [](const auto& info) {
                           switch (info.param) {
                             case SwapFaultKind::kIoError: return std::string("eio");
                             case SwapFaultKind::kShortRead: return std::string("short_read");
                             default: return std::string("enospc");
                           }
                         });

// A real small file system where one can be mounted (root, a kernel that allows tmpfs here).
TEST(NvmeSpace, NotEnoughSpaceStopsBeforeStepOneWithOneLine) {
  ScratchDirectory scratch;
  const std::string tiny = scratch.path("tiny");
  fs::create_directories(tiny);
  if (::mount("tmpfs", tiny.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  RunSpec spec;
  spec.stage = 1;
  spec.steps = 1;
  spec.configure_engine = state_on(Where::kNvme, tiny);  // ~40 sub-groups of 12 KiB: 480 KiB
  std::string message;
  try {
    run_mlp(spec);
  } catch (const Error& error) {
    message = error.what();
  }
  const bool empty = fs::is_empty(tiny);
  ::umount(tiny.c_str());
  EXPECT_NE(message.find("nvme_path '" + tiny + "'"), std::string::npos) << message;
  EXPECT_NE(message.find("bytes free"), std::string::npos) << message;
  EXPECT_TRUE(empty);
}

}  // namespace
}  // namespace zest
