// Every injected fault (engine/fault_injection.h) has its defined outcome: a rank that throws or
// stalls ends the run with an error naming it, within the timeout; a NaN gradient stops fp32 and
// bf16 training naming the step, the rank and the unit, and makes fp16 skip the step; a failed
// allocation is the out-of-memory message. Nothing hangs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "models/mlp.h"
#include "engine/engine.h"
#include "runtime/world.h"
#include "tests/engine/engine_test_support.h"

namespace zest {
namespace {

using Clock = std::chrono::steady_clock;

struct Outcome {
  std::string error;  // empty when the run finished
  ErrorKind kind = ErrorKind::kInternal;
  std::vector<bool> skipped;  // per step, rank 0
  double seconds = 0.0;
};

// The ranks of the world, and hybrid sharding's shard group size (0: none).
struct Layout {
  int ranks = 3;
  int hybrid_shard_size = 0;
};

// `compute_lag`: the compute stream is held this long before each step's forward, so the host
// runs ahead of the work it enqueues (as it does on a busy machine).
Outcome run(FaultInjection fault, int stage = 2, DType dtype = DType::kFloat32,
            std::chrono::milliseconds timeout = std::chrono::seconds(20), Layout layout = {},
            std::chrono::milliseconds compute_lag = {}) {
  Outcome outcome;
  WorldOptions world_options;
  world_options.ranks = layout.ranks;
  world_options.timeout = timeout;
  const auto start = Clock::now();
  try {
    World(world_options).run([&](RankContext& context) {
      Mlp model(MlpConfig{{8, 16, 16, 4}});
      EngineOptions options;
      options.stage = stage;
      options.compute_dtype = dtype;
      options.loss_scale.enabled = dtype == DType::kFloat16;
      options.fault = fault;
      options.hybrid_shard_size = layout.hybrid_shard_size;
      Engine engine(context, options);
      auto trainer = engine.shard(model, make_optimizer(OptimizerOptions{}));
      std::vector<float> inputs(static_cast<std::size_t>(layout.ranks) * 2 * 8);
      std::vector<std::int32_t> labels(static_cast<std::size_t>(layout.ranks) * 2);
      for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = std::cos(0.3f * i);
      for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 4);
      const Batch batch = testing::rank_rows(inputs, labels, 8, context.rank, 2);
      for (int step = 1; step <= 4; ++step) {
        if (compute_lag.count() > 0) {
          context.compute.enqueue([compute_lag] { std::this_thread::sleep_for(compute_lag); });
        }
        trainer->forward_backward(batch);
        const StepStats stats = trainer->step();
        if (context.rank == 0) outcome.skipped.push_back(stats.skipped);
      }
    });
  } catch (const Error& error) {
    outcome.error = error.what();
    outcome.kind = error.kind();
  }
  outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return outcome;
}

FaultInjection fault(FaultInjection::Kind kind, int rank, std::int64_t step) {
  FaultInjection injected;
  injected.kind = kind;
  injected.rank = rank;
  injected.step = step;
  return injected;
}

TEST(FaultInjection, NoFaultTrainsEveryStep) {
  const Outcome outcome = run({});
  EXPECT_EQ(outcome.error, "");
  EXPECT_EQ(outcome.skipped, (std::vector<bool>{false, false, false, false}));
}

TEST(FaultInjection, ARankThatThrowsIsNamedWithTheStep) {
  const Outcome outcome = run(fault(FaultInjection::Kind::kThrow, 1, 3));
  EXPECT_EQ(outcome.error, "rank 1: injected failure (debug.fault \"throw\") at step 3");
  EXPECT_LT(outcome.seconds, 10.0);  // the peers fail at once, not after the 20 s timeout
}

TEST(FaultInjection, ARankThatStallsPastTheTimeoutIsNamed) {
  FaultInjection stall = fault(FaultInjection::Kind::kStall, 2, 2);
  stall.stall_seconds = 3.0;
  const Outcome outcome = run(stall, 3, DType::kFloat32, std::chrono::milliseconds(500));
  // The first rank to report may be one whose stream waited on the timed-out one (a peer
  // failure by kind); the message carries the timeout either way.
  EXPECT_TRUE(outcome.kind == ErrorKind::kCommTimeout || outcome.kind == ErrorKind::kPeerFailure)
      << outcome.error;
  EXPECT_NE(outcome.error.find("timed out after 0.5"), std::string::npos) << outcome.error;
  EXPECT_NE(outcome.error.find("waiting for rank(s) 2"), std::string::npos) << outcome.error;
}

class NanGradient : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(NanGradient, StopsNamingTheStepRankAndUnit) {
  const auto [stage, dtype] = GetParam();
  FaultInjection nan = fault(FaultInjection::Kind::kNanGradient, 1, 2);
  nan.unit = "layer1";
  const Outcome outcome = run(nan, stage, dtype);
  EXPECT_EQ(outcome.kind, ErrorKind::kDivergence) << outcome.error;
  EXPECT_NE(outcome.error.find("non-finite gradient at step 2 on rank 1, unit layer1 ("),
            std::string::npos)
      << outcome.error;
  // Step 1 trained; the error came at step 2.
  EXPECT_EQ(outcome.skipped, (std::vector<bool>{false}));
}

INSTANTIATE_TEST_SUITE_P(StagesAndDtypes, NanGradient,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3),
                                            ::testing::Values(DType::kFloat32, DType::kBFloat16)));

TEST(FaultInjection, ANanGradientInFp16SkipsTheStep) {
  const Outcome outcome = run(fault(FaultInjection::Kind::kNanGradient, 0, 2), 3, DType::kFloat16);
  EXPECT_EQ(outcome.error, "");
  EXPECT_EQ(outcome.skipped, (std::vector<bool>{false, true, false, false}));
}

TEST(FaultInjection, AFailedAllocationIsTheOutOfMemoryMessage) {
  const Outcome outcome = run(fault(FaultInjection::Kind::kFailAllocation, 2, 2));
  EXPECT_EQ(outcome.kind, ErrorKind::kOutOfMemory) << outcome.error;
  EXPECT_NE(outcome.error.find("rank 2: out of memory on cpu:2"), std::string::npos)
      << outcome.error;
  EXPECT_NE(outcome.error.find("for 'activations'; injected by debug.fault"), std::string::npos)
      << outcome.error;
}

// In 2-byte compute each call widens its unit's parameters into fp32 copies on the compute
// stream. An out-of-memory inside the call unwinds those copies while the stream, behind the
// host, has yet to write them: they are freed after it, not at once (which wrote into freed
// heap memory: a crash at the next allocation, or a heap-use-after-free under ASan).
TEST(FaultInjection, AFailedAllocationIn2ByteComputeFreesNothingTheStreamStillWrites) {
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const int stage : {0, 3}) {
      const Outcome outcome =
          run(fault(FaultInjection::Kind::kFailAllocation, 1, 2), stage, dtype,
              std::chrono::seconds(20), Layout{}, std::chrono::milliseconds(100));
      EXPECT_EQ(outcome.kind, ErrorKind::kOutOfMemory) << outcome.error;
      EXPECT_NE(outcome.error.find("rank 1: out of memory on cpu:1"), std::string::npos)
          << outcome.error;
    }
  }
}

// debug.fault.rank is a world rank in every layout. Under hybrid sharding each rank's trainer sees
// its rank inside its shard group, which world ranks 0 and 2 (groups of 2) or all four (groups
// of 1) share: the fault hit every rank of that index, or none at all.
TEST(FaultInjection, UnderHybridShardingAThrowHitsTheWorldRankNamed) {
  const Outcome outcome = run(fault(FaultInjection::Kind::kThrow, 3, 2), 2, DType::kFloat32,
                              std::chrono::seconds(20), Layout{4, 2});
  EXPECT_EQ(outcome.error, "rank 3: injected failure (debug.fault \"throw\") at step 2");
}

TEST(FaultInjection, UnderHybridShardingAStallOfAWorldRankTimesOutNamingIt) {
  for (const int shard_size : {2, 1}) {
    FaultInjection stall = fault(FaultInjection::Kind::kStall, 2, 2);
    stall.stall_seconds = 3.0;
    const Outcome outcome = run(stall, 3, DType::kFloat32, std::chrono::milliseconds(500),
                                Layout{4, shard_size});
    EXPECT_NE(outcome.error.find("timed out after 0.5"), std::string::npos)
        << "shard groups of " << shard_size << ": " << outcome.error;
    // Groups of 2: rank 2's replica (rank 3) may be the one a peer of the other shard group
    // waits for; groups of 1: every rank is its own shard group and the world's is the only
    // collective that waits.
    const std::string named = shard_size == 1 ? "waiting for rank(s) 2" : "waiting for rank(s) ";
    EXPECT_NE(outcome.error.find(named), std::string::npos)
        << "shard groups of " << shard_size << ": " << outcome.error;
    EXPECT_EQ(outcome.error.find("rank(s) 0;"), std::string::npos) << outcome.error;
  }
}

// The step's flag is summed over every rank, the shard groups' and the replica groups', and so
// is the divergence report: a rank of the other shard group names rank 3 too (it used to say "in
// the reduced gradients", and won the race about half the time). Repeated: the ranks race.
TEST(FaultInjection, UnderHybridShardingANanGradientNamesTheWorldRank) {
  for (int run_index = 0; run_index < 4; ++run_index) {
    FaultInjection nan = fault(FaultInjection::Kind::kNanGradient, 3, 2);
    nan.unit = "layer1";
    const Outcome outcome = run(nan, 2, DType::kFloat32, std::chrono::seconds(20), Layout{4, 2});
    EXPECT_EQ(outcome.kind, ErrorKind::kDivergence) << outcome.error;
    EXPECT_NE(outcome.error.find("non-finite gradient at step 2 on rank 3, unit layer1 ("),
              std::string::npos)
        << outcome.error;
  }
}

}  // namespace
}  // namespace zest
