// The `local` communicator's failure paths: a mismatch, a timeout, a rank that exits, throws or
// whose stream fails, and a late rank after a peer gave up — each ending quickly with the error
// that names the cause, and never touching a buffer a peer has freed.
#include "runtime/local_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/world.h"
#include "tests/runtime/local_world_support.h"

namespace zest {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using testing::capture_error;
using testing::run_world;
using Clock = std::chrono::steady_clock;

// ---- failures --------------------------------------------------------------------------------

TEST(LocalCommunicator, DifferentCollectivesAreAMismatchNamingBoth) {
  std::vector<std::vector<float>> send(2, std::vector<float>(16, 1.0f));
  std::vector<std::vector<float>> recv(2, std::vector<float>(32, 0.0f));
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      const int r = context.rank;
      if (r == 0) {
        context.communicator.all_gather(context.comm, send[r].data(), recv[r].data(), 8,
                                        DType::kFloat32);
      } else {
        context.communicator.all_reduce(context.comm, send[r].data(), recv[r].data(), 8,
                                        DType::kFloat32, Reduction::kSum);
      }
    });
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("all_gather"));
  EXPECT_THAT(error.what(), HasSubstr("all_reduce"));
  EXPECT_THAT(error.what(), HasSubstr("rank 1"));
}

TEST(LocalCommunicator, DifferentCountsAreAMismatchNamingBoth) {
  std::vector<std::vector<float>> send(3, std::vector<float>(16, 1.0f));
  std::vector<std::vector<float>> recv(3, std::vector<float>(64, 0.0f));
  const Error error = capture_error([&] {
    run_world(3, [&](RankContext& context) {
      const int r = context.rank;
      const std::size_t count = r == 2 ? 5 : 4;
      context.communicator.all_gather(context.comm, send[r].data(), recv[r].data(), count,
                                      DType::kFloat32);
    });
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("4 x fp32"));
  EXPECT_THAT(error.what(), HasSubstr("5 x fp32"));
  EXPECT_THAT(error.what(), HasSubstr("rank 2"));
}

TEST(LocalCommunicator, DifferentDtypesOrReductionsAreAMismatch) {
  std::vector<std::vector<float>> send(2, std::vector<float>(16, 1.0f));
  std::vector<std::vector<float>> recv(2, std::vector<float>(16, 0.0f));
  const Error dtype_error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      const int r = context.rank;
      context.communicator.all_reduce(context.comm, send[r].data(), recv[r].data(), 4,
                                      r == 0 ? DType::kFloat32 : DType::kBFloat16,
                                      Reduction::kSum);
    });
  });
  EXPECT_EQ(dtype_error.kind(), ErrorKind::kCommMismatch) << dtype_error.what();
  EXPECT_THAT(dtype_error.what(), HasSubstr("bf16"));
  const Error reduction_error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      const int r = context.rank;
      context.communicator.reduce_scatter(context.comm, send[r].data(), recv[r].data(), 4,
                                          DType::kFloat32,
                                          r == 0 ? Reduction::kSum : Reduction::kMean);
    });
  });
  EXPECT_EQ(reduction_error.kind(), ErrorKind::kCommMismatch) << reduction_error.what();
  EXPECT_THAT(reduction_error.what(), HasSubstr("mean"));
}

TEST(LocalCommunicator, StalledRankTimesOutNamingCollectiveRankAndTimeout) {
  // Rank 1 neither calls the collective nor exits until well after the 300 ms timeout.
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> buffers(kRanks, std::vector<float>(10, 1.0f));
  std::atomic<long> failed_after_ms{-1};
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(
        kRanks,
        [&](RankContext& context) {
          const int r = context.rank;
          if (r == 1) {
            std::this_thread::sleep_for(milliseconds(1500));
            return;
          }
          context.communicator.all_reduce(context.comm, buffers[r].data(), buffers[r].data(), 10,
                                          DType::kFloat32, Reduction::kSum);
          try {
            context.comm.synchronize();
          } catch (...) {
            if (r == 0) {
              failed_after_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start)
                                    .count();
            }
            throw;
          }
        },
        milliseconds(300));
  });
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("all_reduce"));
  EXPECT_THAT(error.what(), HasSubstr("rank(s) 1"));
  EXPECT_THAT(error.what(), HasSubstr("0.3"));  // the timeout, in seconds
  EXPECT_THAT(error.what(), HasSubstr("timed out"));
  // Failed by the timeout, not by rank 1 finishing.
  EXPECT_GE(failed_after_ms.load(), 290);
  EXPECT_LT(failed_after_ms.load(), 1400);
  EXPECT_LT(elapsed, std::chrono::seconds(4));
}

// Found by ASan (FaultInjection.ARankThatStallsPastTheTimeoutIsNamed): rank 1 arrives after
// rank 0 timed out and freed its buffer. The meeting then looked complete to rank 1, which
// copied from the freed buffer; now a rank that gives up withdraws, and rank 1 fails instead.
TEST(LocalCommunicator, ARankArrivingAfterItsPeerTimedOutReadsNothingOfIt) {
  std::string late_error;
  const Error error = capture_error([&] {
    run_world(
        2,
        [&](RankContext& context) {
          if (context.rank == 1) std::this_thread::sleep_for(milliseconds(600));
          // Heap buffers, freed as soon as the rank's function unwinds.
          auto send = std::make_unique<std::vector<float>>(1000, 1.0f + context.rank);
          auto recv = std::make_unique<std::vector<float>>(2000);
          context.communicator.all_gather(context.comm, send->data(), recv->data(), 1000,
                                          DType::kFloat32);
          try {
            context.comm.synchronize();
          } catch (const Error& failure) {
            if (context.rank == 1) late_error = failure.what();
            throw;
          }
        },
        milliseconds(200));
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(late_error, HasSubstr("rank 0 failed"));
  EXPECT_THAT(late_error, HasSubstr("timed out"));
}

TEST(LocalCommunicator, TimeoutNamesEveryMissingRank) {
  constexpr int kRanks = 4;
  std::vector<std::vector<float>> buffers(kRanks, std::vector<float>(kRanks * 2, 1.0f));
  std::vector<std::vector<float>> out(kRanks, std::vector<float>(2));
  const Error error = capture_error([&] {
    run_world(
        kRanks,
        [&](RankContext& context) {
          const int r = context.rank;
          if (r == 1 || r == 3) {
            std::this_thread::sleep_for(milliseconds(800));
            return;
          }
          context.communicator.reduce_scatter(context.comm, buffers[r].data(), out[r].data(), 2,
                                              DType::kFloat32, Reduction::kSum);
        },
        milliseconds(200));
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("reduce_scatter"));
  EXPECT_THAT(error.what(), HasSubstr("rank(s) 1, 3"));
}

// A chain of waits (a pipeline: stage 2 receives from stage 1, which receives from the stalled
// stage 0) names the rank the chain ends at, not the healthy rank that only waits in turn.
TEST(LocalCommunicator, ATimeoutAlongAChainOfWaitsNamesTheStalledRankNotAHealthyOne) {
  std::vector<std::vector<float>> buffers(3, std::vector<float>(4, 1.0f));
  const Error error = capture_error([&] {
    run_world(
        3,
        [&](RankContext& context) {
          const int r = context.rank;
          if (r == 0) {
            std::this_thread::sleep_for(milliseconds(1200));
            return;
          }
          // Rank 1 begins to wait later than rank 2, so rank 2 times out first, while rank 1
          // still waits for rank 0.
          if (r == 1) std::this_thread::sleep_for(milliseconds(200));
          context.communicator.receive(context.comm, buffers[r].data(), 4, DType::kFloat32,
                                       r - 1);
          context.comm.synchronize();
        },
        milliseconds(400));
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), StartsWith("rank 2: "));
  EXPECT_THAT(error.what(), HasSubstr("rank 1 waits in turn for rank(s) 0"));
  EXPECT_THAT(error.what(), Not(HasSubstr("rank 1 is stalled")));
}

TEST(LocalCommunicator, RankThatExitsWithoutCallingFailsThePeersAtOnce) {
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> send(kRanks, std::vector<float>(4, 1.0f));
  std::vector<std::vector<float>> recv(kRanks, std::vector<float>(kRanks * 4));
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(
        kRanks,
        [&](RankContext& context) {
          const int r = context.rank;
          if (r == 2) return;
          context.communicator.all_gather(context.comm, send[r].data(), recv[r].data(), 4,
                                          DType::kFloat32);
        },
        milliseconds(30000));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("all_gather"));
  EXPECT_THAT(error.what(), HasSubstr("rank(s) 2 finished without calling"));
}

TEST(LocalCommunicator, RankThatThrowsFailsThePeersAtOnceAndIsReportedAsTheCause) {
  for (int ranks : {2, 4, 8}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const int thrower = ranks - 1;
    std::vector<std::vector<float>> buffers(ranks, std::vector<float>(8, 1.0f));
    const auto start = Clock::now();
    const Error error = capture_error([&] {
      run_world(
          ranks,
          [&](RankContext& context) {
            const int r = context.rank;
            if (r == thrower) {
              // Let the peers get into the collective first.
              std::this_thread::sleep_for(milliseconds(50));
              throw std::runtime_error("loss is NaN at step 12");
            }
            context.communicator.all_reduce(context.comm, buffers[r].data(), buffers[r].data(), 8,
                                            DType::kFloat32, Reduction::kSum);
          },
          milliseconds(30000));
    });
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    EXPECT_NE(error.kind(), ErrorKind::kPeerFailure) << error.what();
    EXPECT_THAT(error.what(), StartsWith("rank " + std::to_string(thrower) + ": "));
    EXPECT_THAT(error.what(), HasSubstr("loss is NaN at step 12"));
  }
}

TEST(LocalCommunicator, RankWhoseStreamFailsIsReportedAsTheCause) {
  // The failure happens inside stream work before the collective: the rank's later collective
  // is skipped, and its peers must not wait out the timeout for it.
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> buffers(kRanks, std::vector<float>(8, 1.0f));
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(
        kRanks,
        [&](RankContext& context) {
          const int r = context.rank;
          if (r == 1) {
            context.comm.enqueue([] { throw Error(ErrorKind::kData, "batch 3 is empty"); });
          }
          context.communicator.all_reduce(context.comm, buffers[r].data(), buffers[r].data(), 8,
                                          DType::kFloat32, Reduction::kSum);
        },
        milliseconds(30000));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(error.kind(), ErrorKind::kData) << error.what();
  EXPECT_THAT(error.what(), StartsWith("rank 1: "));
  EXPECT_THAT(error.what(), HasSubstr("batch 3 is empty"));
}

TEST(LocalCommunicator, LaterCollectivesAfterAFailureFailFast) {
  // Once the group has failed, every queued collective on every rank fails at once.
  constexpr int kRanks = 4;
  std::vector<std::vector<float>> buffers(kRanks, std::vector<float>(8, 1.0f));
  const auto start = Clock::now();
  EXPECT_THROW(run_world(
                   kRanks,
                   [&](RankContext& context) {
                     const int r = context.rank;
                     for (int i = 0; i < 20; ++i) {
                       context.communicator.all_reduce(context.comm, buffers[r].data(),
                                                       buffers[r].data(), 8, DType::kFloat32,
                                                       Reduction::kSum);
                       context.communicator.barrier(context.prefetch);
                     }
                     if (r == 0) throw std::runtime_error("stop");
                   },
                   milliseconds(30000)),
               Error);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace zest
