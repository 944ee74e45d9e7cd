// ctest-labels: mpi
// Groups and point-to-point on the `mpi` communicator, under mpirun with 2 and 4 processes: the
// device mesh's groups (MPI_Comm_split) reducing only among their members, transfers pairing in
// each pair's issue order whatever stream starts them, inside a group too, and a receive whose
// send never comes, or comes with another size, failing with a message naming both ranks. A
// peer that dies: mpi_pipeline_faults_mpi_test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "runtime/cpu_stream.h"
#include "runtime/device_mesh.h"
#include "runtime/mpi_communicator.h"
#include "runtime/mpi_process.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::capture_error;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kTimeout(30000);

int world_rank() { return MpiProcess::get().rank(); }
int world_size() { return MpiProcess::get().size(); }

TEST(MpiGroups, MeshGroupsReduceOnlyAmongTheirMembers) {
  MpiCommunicator world(kTimeout);
  const DeviceMesh mesh(world_size(), 2);
  const MeshCoordinate at = mesh.coordinate(world_rank());
  auto data_parallel = world.split(at.pipeline_stage, at.data_parallel_index,
                                   mesh.data_parallel_group_name(at.pipeline_stage));
  auto pipeline = world.split(at.data_parallel_index, at.pipeline_stage,
                              mesh.pipeline_group_name(at.data_parallel_index));
  ASSERT_NE(data_parallel, nullptr);
  ASSERT_NE(pipeline, nullptr);
  EXPECT_EQ(data_parallel->world_size(), mesh.data_parallel_size());
  EXPECT_EQ(data_parallel->rank(), at.data_parallel_index);
  EXPECT_EQ(pipeline->rank(), at.pipeline_stage);
  EXPECT_EQ(pipeline->world_rank_of(1), mesh.pipeline_group(at.data_parallel_index)[1]);
  cpu::CpuStream stream("comm");
  float mine = static_cast<float>(1 << world_rank());
  float data_parallel_sum = 0.0f, pipeline_sum = 0.0f;
  data_parallel->all_reduce(stream, &mine, &data_parallel_sum, 1, DType::kFloat32,
                            Reduction::kSum);
  pipeline->all_reduce(stream, &mine, &pipeline_sum, 1, DType::kFloat32, Reduction::kSum);
  stream.synchronize();
  float expected_data_parallel = 0.0f, expected_pipeline = 0.0f;
  for (int r : mesh.data_parallel_group(at.pipeline_stage)) expected_data_parallel += 1 << r;
  for (int r : mesh.pipeline_group(at.data_parallel_index)) expected_pipeline += 1 << r;
  EXPECT_EQ(data_parallel_sum, expected_data_parallel);
  EXPECT_EQ(pipeline_sum, expected_pipeline);
  EXPECT_EQ(world.split(-1, 0, "nobody"), nullptr);
}

TEST(MpiGroups, TransfersPairInIssueOrderWhateverStreamStartsThem) {
  MpiCommunicator world(kTimeout);
  cpu::CpuStream first("comm"), second("prefetch");
  const int r = world_rank();
  const int next = (r + 1) % world_size(), previous = (r + world_size() - 1) % world_size();
  // Large enough that Open MPI does not send them eagerly.
  constexpr std::size_t kCount = 100000;
  std::vector<std::vector<float>> sent(4, std::vector<float>(kCount));
  std::vector<std::vector<float>> received(4, std::vector<float>(kCount, -1.0f));
  for (std::size_t i = 0; i < sent.size(); ++i) {
    for (std::size_t j = 0; j < kCount; ++j) sent[i][j] = static_cast<float>(r * 1000 + i * 10) + j % 7;
  }
  // The first stream starts late: send #1 (on the second) is posted before send #0.
  first.enqueue([] { std::this_thread::sleep_for(milliseconds(50)); });
  for (std::size_t i = 0; i < sent.size(); ++i) {
    world.send(i % 2 == 0 ? first : second, sent[i].data(), kCount, DType::kFloat32, next);
  }
  cpu::CpuStream receiver("compute");
  for (auto& buffer : received) world.receive(receiver, buffer.data(), kCount, DType::kFloat32, previous);
  receiver.synchronize();
  first.synchronize();
  second.synchronize();
  for (std::size_t i = 0; i < received.size(); ++i) {
    for (std::size_t j = 0; j < kCount; j += 997) {
      ASSERT_EQ(received[i][j], static_cast<float>(previous * 1000 + i * 10) + j % 7) << i;
    }
  }
}

TEST(MpiGroups, AReceiveWhoseSendNeverComesTimesOutNamingBothRanks) {
  MpiCommunicator world(milliseconds(500));
  cpu::CpuStream stream("compute");
  if (world_rank() == 1) {
    float value = 0.0f;
    world.begin_step(4);
    world.label_next("activations of micro-batch 3 from pipeline stage 0");
    world.receive(stream, &value, 1, DType::kFloat32, 0);
    const auto start = Clock::now();
    const Error error = capture_error([&] { stream.synchronize(); });
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
    EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
    EXPECT_THAT(error.what(), HasSubstr("rank 1 waited 0.5 s for rank 0 to send 'activations of "
                                        "micro-batch 3 from pipeline stage 0' (receive #0, 1 x "
                                        "fp32) at step 4; rank 0 is stalled or never sends it"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiGroups, ASendOfAnotherSizeIsAMismatchOnTheReceiver) {
  MpiCommunicator world(kTimeout);
  cpu::CpuStream stream("compute");
  std::vector<float> buffer(8, 1.0f);
  if (world_rank() == 0) {
    world.send(stream, buffer.data(), 8, DType::kFloat32, 1);
    stream.synchronize();
  } else if (world_rank() == 1) {
    world.receive(stream, buffer.data(), 4, DType::kFloat32, 0);
    const Error error = capture_error([&] { stream.synchronize(); });
    EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
    EXPECT_THAT(error.what(), HasSubstr("point-to-point mismatch: rank 0 sent 32 bytes (send #0) "
                                        "but rank 1 receives 16"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiGroups, ATransferInsideAGroupNamesWorldRanks) {
  MpiCommunicator world(kTimeout);
  const DeviceMesh mesh(world_size(), 2);
  const MeshCoordinate at = mesh.coordinate(world_rank());
  auto pipeline = world.split(at.data_parallel_index, at.pipeline_stage,
                              mesh.pipeline_group_name(at.data_parallel_index), milliseconds(500));
  EXPECT_EQ(pipeline->timeout(), milliseconds(500));
  cpu::CpuStream stream("compute");
  float value = 3.0f;
  // Stage 0 sends one activation; stage 1 receives it, then waits for a second that never comes.
  if (at.pipeline_stage == 0) {
    pipeline->send(stream, &value, 1, DType::kFloat32, 1);
    stream.synchronize();
  } else {
    float got = 0.0f;
    pipeline->receive(stream, &got, 1, DType::kFloat32, 0);
    stream.synchronize();
    EXPECT_EQ(got, 3.0f);
    pipeline->receive(stream, &got, 1, DType::kFloat32, 0);
    const Error error = capture_error([&] { stream.synchronize(); });
    const int sender = mesh.rank_of({0, at.data_parallel_index});
    EXPECT_THAT(error.what(),
                HasSubstr("rank " + std::to_string(world_rank()) + " waited 0.5 s for rank " +
                          std::to_string(sender) + " to send its data (receive #1, 1 x fp32) in "
                          "the " + mesh.pipeline_group_name(at.data_parallel_index)));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace zest
