// ctest-labels: gpu
// Groups and point-to-point on the `nccl` communicator, ranks as threads of this process, one GPU
// each (a case needing more GPUs than are visible skips, saying so): a split's groups reduce only
// among their members and know their world ranks, a negative color joins none, transfers pair in
// issue order, and a receive whose send never comes fails within the group's own timeout naming
// the transfer and the group.
#include "runtime/nccl_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_stream.h"
#include "runtime/device_mesh.h"
#include "tests/support/capture_error.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using namespace std::chrono_literals;
using testing::DeviceArray;
using ::testing::HasSubstr;
using testing::capture_error;

#define ZEST_SKIP_WITHOUT_GPUS(ranks)                                                          \
  do {                                                                                         \
    const cuda::DeviceCount zest_devices_ = cuda::visible_devices();                           \
    if (zest_devices_.count < (ranks)) {                                                       \
      GTEST_SKIP() << "needs " << (ranks) << " GPUs, found " << zest_devices_.count            \
                   << (zest_devices_.reason.empty() ? "" : " (" + zest_devices_.reason + ")"); \
    }                                                                                          \
  } while (0)

using RankBody = std::function<void(int rank, NcclCommunicator&, Stream&)>;

void run_ranks(int ranks, std::chrono::milliseconds timeout, const RankBody& body) {
  auto group = NcclCommunicator::create_group(ranks, timeout);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        EXPECT_EQ(cudaSetDevice(rank), cudaSuccess);
        cuda::CudaStream stream("comm", rank);
        body(rank, *group[rank], stream);
      } catch (const std::exception& error) {
        ADD_FAILURE() << "rank " << rank << ": " << error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  NcclCommunicator::destroy_group(group);
}

TEST(NcclGroups, ASplitOfOneRankIsAGroupOfOne) {
  ZEST_SKIP_WITHOUT_GPUS(1);
  run_ranks(1, 30s, [](int, NcclCommunicator& world, Stream& stream) {
    EXPECT_EQ(world.split(-1, 0, "nobody"), nullptr);
    auto group = world.split(0, 0, "data-parallel group of pipeline stage 0 (ranks 0)");
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->world_size(), 1);
    EXPECT_EQ(group->world_rank_of(0), 0);
    EXPECT_EQ(group->group_name(), "data-parallel group of pipeline stage 0 (ranks 0)");
    DeviceArray<float> value(std::vector<float>{2.0f});
    group->all_reduce(stream, value.data(), value.data(), 1, DType::kFloat32, Reduction::kSum);
    stream.synchronize();
    EXPECT_EQ(value.download()[0], 2.0f);
  });
}

TEST(NcclGroups, MeshGroupsReduceOnlyAmongTheirMembers) {
  ZEST_SKIP_WITHOUT_GPUS(4);
  const DeviceMesh mesh(4, 2);
  run_ranks(4, 30s, [&](int rank, NcclCommunicator& world, Stream& stream) {
    const MeshCoordinate at = mesh.coordinate(rank);
    auto data_parallel = world.split(at.pipeline_stage, at.data_parallel_index,
                                     mesh.data_parallel_group_name(at.pipeline_stage));
    ASSERT_NE(data_parallel, nullptr);
    EXPECT_EQ(data_parallel->rank(), at.data_parallel_index);
    EXPECT_EQ(data_parallel->world_rank_of(1), mesh.data_parallel_group(at.pipeline_stage)[1]);
    DeviceArray<float> value(std::vector<float>{static_cast<float>(1 << rank)});
    data_parallel->all_reduce(stream, value.data(), value.data(), 1, DType::kFloat32,
                              Reduction::kSum);
    stream.synchronize();
    EXPECT_EQ(value.download()[0], at.pipeline_stage == 0 ? 3.0f : 12.0f);
  });
}

TEST(NcclGroups, TransfersPairInIssueOrder) {
  ZEST_SKIP_WITHOUT_GPUS(2);
  run_ranks(2, 30s, [](int rank, NcclCommunicator& world, Stream& stream) {
    std::vector<std::unique_ptr<DeviceArray<float>>> buffers;
    for (int i = 0; i < 3; ++i) {
      buffers.push_back(std::make_unique<DeviceArray<float>>(
          std::vector<float>(1031, rank == 0 ? static_cast<float>(i + 1) : 0.0f)));
    }
    for (auto& buffer : buffers) {
      if (rank == 0) world.send(stream, buffer->data(), buffer->size(), DType::kFloat32, 1);
      if (rank == 1) world.receive(stream, buffer->data(), buffer->size(), DType::kFloat32, 0);
    }
    stream.synchronize();
    if (rank == 1) {
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(buffers[i]->download()[1030], static_cast<float>(i + 1));
      }
    }
  });
}

TEST(NcclGroups, AReceiveWhoseSendNeverComesFailsWithinTheGroupsTimeout) {
  ZEST_SKIP_WITHOUT_GPUS(2);
  run_ranks(2, 30s, [](int rank, NcclCommunicator& world, Stream& stream) {
    auto pipeline = world.split(0, rank, "pipeline group of data-parallel index 0 (ranks 0, 1)",
                                1s);
    ASSERT_NE(pipeline, nullptr);
    if (rank == 0) {
      std::this_thread::sleep_for(3s);  // never sends
      return;
    }
    DeviceArray<float> value(1);
    pipeline->label_next("activations of micro-batch 0 from pipeline stage 0");
    // Note: the receive itself may fail: NCCL connects a pair of ranks at their first transfer,
    // which needs the peer, so the issue can time out before any kernel runs.
    const Error error = capture_error([&] {
      pipeline->receive(stream, value.data(), 1, DType::kFloat32, 0);
      stream.synchronize();
    });
    EXPECT_THAT(error.what(), HasSubstr("receive #0 (1 x fp32) 'activations of micro-batch 0 "
                                        "from pipeline stage 0' from rank 0"));
    EXPECT_THAT(error.what(), HasSubstr("pipeline group of data-parallel index 0"));
  });
}

}  // namespace
}  // namespace zest
