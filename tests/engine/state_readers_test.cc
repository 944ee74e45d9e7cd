// Trainer::hold_state_for: an asynchronous checkpoint's snapshot copies the state on a stream of
// its own while the next step's forward and backward run, and the trainer's next update waits
// for it. Here the reader is a stream held back for 300 ms: the step after the hold returns only
// once the reader has run — for the ZeRO trainer at stages 0 and 3, with 2-byte compute, with the
// optimizer offloaded, for the outer loop's groups and for pipeline stages (whose update is each
// chunk trainer's). A trainer that did not wait would return from its step long before.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "runtime/cpu_device.h"
#include "tests/engine/engine_test_support.h"
#include "tests/pipeline/pipeline_test_support.h"

namespace zest {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kHeldFor = std::chrono::milliseconds(300);

// A stream whose work waits until kHeldFor after it was made; done() is recorded after it.
class SlowReader {
 public:
  SlowReader() : stream_(device_.create_stream("slow reader")), done_(device_.create_event()) {
    std::shared_future<void> go = go_.get_future().share();
    stream_->enqueue([go] { go.wait(); });
    stream_->record(*done_);
    releaser_ = std::thread([this] {
      std::this_thread::sleep_for(kHeldFor);
      released_at_.store(Clock::now());
      go_.set_value();
    });
  }
  ~SlowReader() {
    releaser_.join();
    stream_->synchronize();
  }
  std::shared_ptr<Event> done() const { return done_; }
  Clock::time_point released_at() const { return released_at_.load(); }

 private:
  cpu::CpuDevice device_{0};
  std::unique_ptr<Stream> stream_;
  std::shared_ptr<Event> done_;
  std::promise<void> go_;
  std::atomic<Clock::time_point> released_at_{Clock::time_point::max()};
  std::thread releaser_;
};

// Per rank: the hold is set by hold(), and checked() says whether the step after it returned
// once the reader had run.
class Holds {
 public:
  explicit Holds(int ranks) : readers_(static_cast<std::size_t>(ranks)) {}
  void hold(int rank, Trainer& trainer) {
    auto& reader = readers_[static_cast<std::size_t>(rank)];
    reader = std::make_unique<SlowReader>();
    trainer.hold_state_for(reader->done());
  }
  void expect_waited(int rank) {
    const auto& reader = readers_[static_cast<std::size_t>(rank)];
    ASSERT_NE(reader, nullptr);
    EXPECT_GE(Clock::now(), reader->released_at()) << "rank " << rank << "'s step did not wait";
  }

 private:
  std::vector<std::unique_ptr<SlowReader>> readers_;
};

// Holds the state after step 0; step 1 must return after the reader ran.
void expect_second_step_waits(testing::RunSpec spec) {
  Holds holds(spec.world);
  spec.steps = 2;
  spec.after_step = [&](int rank, int step, const StepStats&, Trainer& trainer) {
    if (step == 0) {
      holds.hold(rank, trainer);
    } else {
      holds.expect_waited(rank);
    }
  };
  testing::run_mlp(spec);
}

TEST(StateReaders, TheZeroTrainersUpdateWaitsForThemAtStages0And3) {
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    testing::RunSpec spec;
    spec.world = 2;
    spec.stage = stage;
    expect_second_step_waits(spec);
  }
}

TEST(StateReaders, TwoByteComputeAndTheOffloadedOptimizerWaitForThem) {
  testing::RunSpec two_byte;
  two_byte.world = 2;
  two_byte.stage = 2;
  two_byte.compute_dtype = DType::kBFloat16;
  expect_second_step_waits(two_byte);
  testing::RunSpec offloaded;
  offloaded.world = 2;
  offloaded.stage = 2;
  offloaded.configure_engine = [](EngineOptions& options) {
    options.offload_optimizer.device = OffloadDevice::kCpu;
  };
  expect_second_step_waits(offloaded);
}

// The hold reaches the inner trainer: its update waits, also on a step without a meeting (the
// meeting, which rewrites the parameters after the update, takes the views again and waits too).
TEST(StateReaders, TheOuterLoopsInnerTrainerWaitsForThem) {
  for (int inner_steps : {1, 3}) {
    SCOPED_TRACE("H = " + std::to_string(inner_steps));
    testing::RunSpec spec;
    spec.world = 4;
    spec.stage = 1;
    spec.configure_engine = [inner_steps](EngineOptions& options) {
      options.outer_loop.groups = 2;
      options.outer_loop.inner_steps = inner_steps;
    };
    expect_second_step_waits(spec);
  }
}

TEST(StateReaders, EveryPipelineStagesUpdateWaitsForThem) {
  Holds holds(4);
  std::vector<int> calls(4, 0);
  testing::PipelineSpec spec;
  spec.stages = 2;
  spec.data_parallel = 2;
  spec.zero_stage = 1;
  spec.steps = 3;
  // After step 0's forward and backward the state is held, so step 0's update must wait; step
  // 1's forward and backward come after it.
  spec.after_forward_backward = [&](int rank, PipelineTrainer& trainer) {
    const int call = calls[static_cast<std::size_t>(rank)]++;
    if (call == 0) holds.hold(rank, trainer);
    if (call == 1) holds.expect_waited(rank);
  };
  testing::train_pipeline(spec);
}

}  // namespace
}  // namespace zest
