// offload_param in the plan: the planner trains the real engine on the shape-only device, so
// with the parameter shards in the host arena its device and host tiers equal, category by
// category and to the byte, what the allocators measure when the same GPT trains, at one rank
// (where the shards are fetched into a ring that plain stage 3 would not have) and more, fp32
// and bf16, with the optimizer offloaded too and with recomputation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "models/gpt.h"
#include "planner/peak_plan.h"
#include "runtime/world.h"
#include "tests/planner/gpt_plan_support.h"

namespace zest {
namespace {

const GptConfig kGpt{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/96,
                     /*seq_len=*/16};
constexpr std::int64_t kSequences = 2;

struct PlanCase {
  std::string name;
  int world;
  DType dtype;
  bool offload_optimizer;
  RecomputePolicy recompute;
  bool cpu_checkpointing;
};

EngineOptions options_of(const PlanCase& job) {
  EngineOptions options = testing::engine_options(3, job.dtype, 2, job.recompute);
  options.activation_checkpointing.cpu_checkpointing = job.cpu_checkpointing;
  options.offload_param.device = OffloadDevice::kCpu;
  if (job.offload_optimizer) options.offload_optimizer.device = OffloadDevice::kCpu;
  return options;
}

struct Tiers {
  std::vector<MemoryUsage> device;  // per rank
  std::vector<MemoryUsage> host;
};

Tiers train(const PlanCase& job) {
  Tiers tiers{std::vector<MemoryUsage>(static_cast<std::size_t>(job.world)),
              std::vector<MemoryUsage>(static_cast<std::size_t>(job.world))};
  WorldOptions world;
  world.ranks = job.world;
  testing::train_gpt_two_steps(kGpt, kSequences, options_of(job), world, /*seed=*/3,
                               [&](RankContext& context, Trainer&) {
                                 const auto rank = static_cast<std::size_t>(context.rank);
                                 tiers.device[rank] = context.allocator().usage();
                                 tiers.host[rank] = context.device.host_allocator().usage();
                               });
  return tiers;
}

// The device tier holds no offload category (it is the host's), so that one is not compared.
bool equal(const MemoryUsage& device, const MemoryUsage& host, const PeakPrediction& planned) {
  if (device.total_peak != planned.device_total || host.total_peak != planned.host_peak_total) {
    return false;
  }
  for (Category category : all_categories()) {
    if (category != Category::kOffload && device.peak_of(category) != planned.of(category)) {
      return false;
    }
    if (host.peak_of(category) != planned.host_of(category)) return false;
  }
  return true;
}

void keep_largest(const std::vector<MemoryUsage>& again, std::vector<MemoryUsage>& measured) {
  for (std::size_t rank = 0; rank < measured.size(); ++rank) {
    for (std::size_t c = 0; c < kCategoryCount; ++c) {
      measured[rank].peak[c] = std::max(measured[rank].peak[c], again[rank].peak[c]);
    }
    measured[rank].total_peak = std::max(measured[rank].total_peak, again[rank].total_peak);
  }
}

class ParameterOffloadPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(ParameterOffloadPlan, DeviceAndHostTiersEqualTheMeasuredPeaksToTheByte) {
  const PlanCase job = GetParam();
  const PeakPrediction planned =
      predict_peak(testing::gpt_plan_input(kGpt, kSequences, options_of(job), job.world));
  EXPECT_EQ(planned.of(Category::kParams), 0u);
  EXPECT_GT(planned.host_of(Category::kParams), 0u);
  EXPECT_EQ(planned.host_of(Category::kParams), planned.model_state.host_params);
  EXPECT_GE(planned.host_total(), planned.host_of(Category::kParams));
  EXPECT_EQ(planned.nvme_total(), 0u);
  // Frees run in stream order: a descheduled host measures less, never more (measured_peaks.h).
  Tiers measured = train(job);
  auto all_equal = [&] {
    for (std::size_t rank = 0; rank < measured.device.size(); ++rank) {
      if (!equal(measured.device[rank], measured.host[rank], planned)) return false;
    }
    return true;
  };
  for (int run = 1; run < 6 && !all_equal(); ++run) {
    const Tiers again = train(job);
    keep_largest(again.device, measured.device);
    keep_largest(again.host, measured.host);
  }
  for (std::size_t rank = 0; rank < measured.device.size(); ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    for (Category category : all_categories()) {
      if (category != Category::kOffload) {
        EXPECT_EQ(measured.device[rank].peak_of(category), planned.of(category))
            << "device " << category_name(category);
      }
      EXPECT_EQ(measured.host[rank].peak_of(category), planned.host_of(category))
          << "host " << category_name(category);
    }
    EXPECT_EQ(measured.device[rank].total_peak, planned.device_total);
    EXPECT_EQ(measured.host[rank].total_peak, planned.host_peak_total);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, ParameterOffloadPlan,
    ::testing::Values(
        PlanCase{"world1_fp32", 1, DType::kFloat32, false, RecomputePolicy::kNone, false},
        PlanCase{"world2_bf16", 2, DType::kBFloat16, false, RecomputePolicy::kNone, false},
        PlanCase{"world2_fp32_optimizer_offloaded", 2, DType::kFloat32, true,
                 RecomputePolicy::kNone, false},
        PlanCase{"world1_bf16_optimizer_offloaded_full", 1, DType::kBFloat16, true,
                 RecomputePolicy::kFull, false},
        PlanCase{"world4_fp32_full_cpu_checkpointing", 4, DType::kFloat32, false,
                 RecomputePolicy::kFull, true}),
    [](const auto& info) { return info.param.name; });

// Moving the shards off the device lowers the device's plan by at least their bytes less the
// one-rank ring and the optimizer's staging (both below a shard set here: two units' worth).
TEST(ParameterOffloadPlanEffect, TheDevicePeakFallsAndTheHostHoldsTheShards) {
  EngineOptions options = testing::engine_options(3, DType::kFloat32, 1);
  const PeakPrediction on_device =
      predict_peak(testing::gpt_plan_input(kGpt, kSequences, options, 2));
  options.offload_param.device = OffloadDevice::kCpu;
  const PeakPrediction offloaded =
      predict_peak(testing::gpt_plan_input(kGpt, kSequences, options, 2));
  EXPECT_EQ(offloaded.host_of(Category::kParams), on_device.of(Category::kParams));
  EXPECT_LT(offloaded.device_total, on_device.device_total);
  EXPECT_EQ(offloaded.of(Category::kGather), on_device.of(Category::kGather));
}

TEST(ParameterOffloadPlanEffect, StageTwoIsRefusedAsTheEngineRefusesIt) {
  EngineOptions options = testing::engine_options(2, DType::kFloat32, 1);
  options.offload_param.device = OffloadDevice::kCpu;
  try {
    predict_peak(testing::gpt_plan_input(kGpt, kSequences, options, 2));
    FAIL() << "expected a config error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(error.what()).find("offload_param"), std::string::npos);
  }
}

}  // namespace
}  // namespace zest
