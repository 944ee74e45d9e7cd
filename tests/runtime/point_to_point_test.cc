// Point-to-point send / receive on the `local` communicator (ranks as threads): pairing in each
// pair's issue order across streams, inside a split group, and every failure — a stalled peer on
// either side, a peer that died or finished without its side, a count that differs — ending both
// ranks with a message that says who waited for whom and what, never a hang.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/device_mesh.h"
#include "runtime/world.h"
#include "tests/runtime/local_world_support.h"

namespace zest {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::capture_error;
using testing::run_world;
using Clock = std::chrono::steady_clock;

TEST(PointToPoint, TransfersPairInIssueOrderWhateverStreamRunsThem) {
  std::vector<std::vector<float>> sent = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}};
  std::vector<std::vector<float>> received(4, std::vector<float>(3, 0.0f));
  run_world(2, [&](RankContext& context) {
    if (context.rank == 0) {
      // Alternate streams, the first send held back: the second must still pair with receive #1.
      context.prefetch.enqueue([] { std::this_thread::sleep_for(milliseconds(50)); });
      for (std::size_t i = 0; i < sent.size(); ++i) {
        Stream& stream = i % 2 == 0 ? context.prefetch : context.comm;
        context.communicator.send(stream, sent[i].data(), 3, DType::kFloat32, 1);
      }
    } else {
      for (auto& buffer : received) {
        context.communicator.receive(context.compute, buffer.data(), 3, DType::kFloat32, 0);
      }
    }
    context.synchronize();
  });
  EXPECT_EQ(received, sent);
}

TEST(PointToPoint, ActivationsForwardAndGradientsBackAlongAPipelineGroup) {
  const DeviceMesh mesh(6, 3);  // 3 pipeline stages x 2 data-parallel ranks
  std::vector<float> out(6, 0.0f), grad(6, 0.0f);
  run_world(6, [&](RankContext& context) {
    const int r = context.rank;
    const MeshCoordinate at = mesh.coordinate(r);
    auto pipeline = context.communicator.split(at.data_parallel_index, at.pipeline_stage,
                                               mesh.pipeline_group_name(at.data_parallel_index));
    const int pipeline_stage = pipeline->rank();
    float activation = 100.0f * static_cast<float>(at.data_parallel_index);
    if (pipeline_stage > 0) {
      pipeline->receive(context.compute, &activation, 1, DType::kFloat32, pipeline_stage - 1);
    }
    context.compute.enqueue(
        [&activation] { activation += 1.0f; });  // this pipeline stage's "layer"
    if (pipeline_stage + 1 < mesh.pipeline_stages()) {
      pipeline->send(context.compute, &activation, 1, DType::kFloat32, pipeline_stage + 1);
    }
    float gradient = 0.0f;
    if (pipeline_stage + 1 < mesh.pipeline_stages()) {
      pipeline->receive(context.compute, &gradient, 1, DType::kFloat32, pipeline_stage + 1);
    }
    context.compute.enqueue([&gradient, &activation] { gradient += activation; });
    if (pipeline_stage > 0)
      pipeline->send(context.compute, &gradient, 1, DType::kFloat32, pipeline_stage - 1);
    context.synchronize();
    out[r] = activation;
    grad[r] = gradient;
  });
  // Index 0: activations 1, 2, 3 by pipeline stage; gradients 3, 3+2, 5+1 back from the last
  // pipeline stage.
  EXPECT_EQ(out, (std::vector<float>{1, 101, 2, 102, 3, 103}));
  EXPECT_EQ(grad, (std::vector<float>{6, 306, 5, 205, 3, 103}));
}

TEST(PointToPoint, AStalledSenderIsATimeoutNamingWhoWaitedForWhomAndWhat) {
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      if (context.rank == 0) {
        std::this_thread::sleep_for(milliseconds(800));
        return;
      }
      std::vector<float> buffer(8);
      context.communicator.begin_step(2);
      context.communicator.label_next("activations of micro-batch 3 from pipeline stage 0");
      context.communicator.receive(context.compute, buffer.data(), 8, DType::kFloat32, 0);
      context.synchronize();
    }, milliseconds(300));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(),
              HasSubstr("rank 1 waited 0.3 s for rank 0 to send 'activations of micro-batch 3 "
                        "from pipeline stage 0' (receive #0, 8 x fp32) at step 2; rank 0 is "
                        "stalled or never sends it"));
}

TEST(PointToPoint, AStalledReceiverIsATimeoutOnTheSendersSide) {
  const Error error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      if (context.rank == 1) {
        std::this_thread::sleep_for(milliseconds(800));
        return;
      }
      float value = 1.0f;
      context.communicator.label_next("gradients of micro-batch 0");
      context.communicator.send(context.comm, &value, 1, DType::kFloat32, 1);
      context.synchronize();
    }, milliseconds(300));
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("rank 0 waited 0.3 s for rank 1 to receive 'gradients of "
                                      "micro-batch 0' (send #0, 1 x fp32)"));
}

TEST(PointToPoint, APeerThatDiesEndsTheWaitAtOnceNamingIt) {
  std::mutex mutex;
  std::string seen_by_receiver;
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      if (context.rank == 0) {
        std::this_thread::sleep_for(milliseconds(50));
        throw Error(ErrorKind::kOutOfMemory, "rank 0 ran out of memory in block3's forward");
      }
      float value = 0.0f;
      context.communicator.label_next("activations of micro-batch 0");
      context.communicator.receive(context.compute, &value, 1, DType::kFloat32, 0);
      try {
        context.synchronize();
      } catch (const Error& failure) {
        std::lock_guard lock(mutex);
        seen_by_receiver = failure.what();
        throw;
      }
    }, milliseconds(20000));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));  // not the 20 s timeout
  EXPECT_EQ(error.kind(), ErrorKind::kOutOfMemory) << error.what();
  EXPECT_THAT(seen_by_receiver,
              HasSubstr("rank 1 waited for rank 0 to send 'activations of micro-batch 0' "
                        "(receive #0, 1 x fp32): rank 0 failed: rank 0 ran out of memory"));
}

TEST(PointToPoint, APeerThatFinishesWithoutSendingIsAMismatch) {
  const Error error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      if (context.rank == 0) return;
      float value = 0.0f;
      context.communicator.receive(context.compute, &value, 1, DType::kFloat32, 0);
      context.synchronize();
    });
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("rank 1 waited for rank 0 to send its data (receive #0, "
                                      "1 x fp32): rank 0 finished without sending it"));
}

TEST(PointToPoint, CountsThatDifferAreAMismatchNamingBothSides) {
  const Error error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      std::vector<float> buffer(8);
      if (context.rank == 0) {
        context.communicator.send(context.comm, buffer.data(), 8, DType::kFloat32, 1);
      } else {
        context.communicator.receive(context.compute, buffer.data(), 4, DType::kFloat32, 0);
      }
      context.synchronize();
    });
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("point-to-point mismatch: rank 0 sent 8 x fp32 (send #0) "
                                      "but rank 1 receives 4 x fp32 (receive #0)"));
}

TEST(PointToPoint, ATransferInAGroupNamesWorldRanksAndTheGroup) {
  const DeviceMesh mesh(4, 2);
  const Error error = capture_error([&] {
    run_world(4, [&](RankContext& context) {
      const MeshCoordinate at = mesh.coordinate(context.rank);
      auto pipeline = context.communicator.split(at.data_parallel_index, at.pipeline_stage,
                                                 mesh.pipeline_group_name(at.data_parallel_index),
                                                 milliseconds(300));
      if (context.rank != 3) {
        if (context.rank == 1) std::this_thread::sleep_for(milliseconds(800));
        return;
      }
      float value = 0.0f;
      pipeline->label_next("activations of micro-batch 1 from pipeline stage 0");
      pipeline->receive(context.compute, &value, 1, DType::kFloat32, 0);
      context.synchronize();
    });
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("rank 3 waited 0.3 s for rank 1 to send 'activations of "
                                      "micro-batch 1 from pipeline stage 0' (receive #0, 1 x "
                                      "fp32) in the pipeline group of data-parallel index 1 "
                                      "(ranks 1, 3); rank 1 is stalled"));
}

TEST(PointToPoint, APeerOutsideTheGroupOrThisRankIsAUsageError) {
  run_world(2, [&](RankContext& context) {
    float value = 0.0f;
    EXPECT_EQ(capture_error([&] {
                context.communicator.send(context.comm, &value, 1, DType::kFloat32, 2);
              }).kind(),
              ErrorKind::kUsage);
    EXPECT_THAT(capture_error([&] {
                  context.communicator.receive(context.comm, &value, 1, DType::kFloat32,
                                               context.rank);
                }).what(),
                HasSubstr("cannot send to or receive from itself"));
  });
}

}  // namespace
}  // namespace zest
