// Groups split from the `local` communicator (ranks as threads): the device mesh's data-parallel
// and pipeline groups, collectives that stay inside their group, each group's own timeout and
// collective-order check naming it, and a failure anywhere ending every group's waits at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
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

struct MeshGroups {
  std::unique_ptr<Communicator> data_parallel;
  std::unique_ptr<Communicator> pipeline;
};

MeshGroups split_mesh(Communicator& world, const DeviceMesh& mesh, int rank,
                      milliseconds data_parallel_timeout = {}) {
  const MeshCoordinate at = mesh.coordinate(rank);
  MeshGroups groups;
  groups.data_parallel =
      world.split(at.pipeline_stage, at.data_parallel_index,
                  mesh.data_parallel_group_name(at.pipeline_stage), data_parallel_timeout);
  groups.pipeline = world.split(at.data_parallel_index, at.pipeline_stage,
                                mesh.pipeline_group_name(at.data_parallel_index));
  return groups;
}

TEST(CommunicatorGroups, MeshGroupsReduceOnlyAmongTheirMembers) {
  const DeviceMesh mesh(4, 2);
  std::vector<float> data_parallel_sum(4), pipeline_sum(4);
  run_world(4, [&](RankContext& context) {
    const int r = context.rank;
    MeshGroups groups = split_mesh(context.communicator, mesh, r);
    ASSERT_NE(groups.data_parallel, nullptr);
    EXPECT_EQ(groups.data_parallel->world_size(), 2);
    EXPECT_EQ(groups.data_parallel->rank(), mesh.coordinate(r).data_parallel_index);
    EXPECT_EQ(groups.pipeline->rank(), mesh.coordinate(r).pipeline_stage);
    EXPECT_EQ(groups.pipeline->world_rank_of(1), mesh.pipeline_group(mesh.coordinate(r).data_parallel_index)[1]);
    EXPECT_THAT(groups.data_parallel->group_name(), HasSubstr("data-parallel group of pipeline stage"));
    float mine = static_cast<float>(1 << r);  // rank r contributes bit r
    groups.data_parallel->all_reduce(context.comm, &mine, &data_parallel_sum[r], 1,
                                     DType::kFloat32, Reduction::kSum);
    groups.pipeline->all_reduce(context.comm, &mine, &pipeline_sum[r], 1, DType::kFloat32,
                                Reduction::kSum);
    context.synchronize();
  });
  // Data-parallel groups {0,1} and {2,3}; pipeline groups {0,2} and {1,3}.
  EXPECT_EQ(data_parallel_sum, (std::vector<float>{3, 3, 12, 12}));
  EXPECT_EQ(pipeline_sum, (std::vector<float>{5, 10, 5, 10}));
}

TEST(CommunicatorGroups, NegativeColorJoinsNoGroup) {
  run_world(3, [&](RankContext& context) {
    auto group = context.communicator.split(context.rank == 1 ? -1 : 0, 0, "the even ranks");
    if (context.rank == 1) {
      EXPECT_EQ(group, nullptr);
      return;
    }
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->world_size(), 2);
    group->barrier(context.comm);
    context.synchronize();
  });
}

TEST(CommunicatorGroups, AGroupTimesOutOnItsOwnTimeoutNamingItself) {
  const DeviceMesh mesh(4, 2);
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(4, [&](RankContext& context) {
      MeshGroups groups = split_mesh(context.communicator, mesh, context.rank, milliseconds(200));
      EXPECT_EQ(groups.data_parallel->timeout(), milliseconds(200));
      EXPECT_EQ(groups.pipeline->timeout(), milliseconds(20000));
      if (context.rank == 3) {
        std::this_thread::sleep_for(milliseconds(800));  // stalled, not finished
        return;
      }
      float value = 1.0f;
      groups.data_parallel->all_reduce(context.comm, &value, &value, 1, DType::kFloat32,
                                       Reduction::kSum);
      context.synchronize();
    });
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(error.kind(), ErrorKind::kCommTimeout) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("on rank 2 in the data-parallel group of pipeline stage 1 "
                                      "(ranks 2, 3)"));
  EXPECT_THAT(error.what(), HasSubstr("timed out after 0.2 s waiting for rank(s) 3"));
}

TEST(CommunicatorGroups, ARankThatFailsEndsItsPeersWaitsInEveryGroupAtOnce) {
  const DeviceMesh mesh(4, 2);
  std::mutex mutex;
  std::string seen_by_rank_3;
  const auto start = Clock::now();
  const Error error = capture_error([&] {
    run_world(4, [&](RankContext& context) {
      MeshGroups groups = split_mesh(context.communicator, mesh, context.rank);
      if (context.rank == 1) throw Error(ErrorKind::kData, "rank 1's batch is unreadable");
      if (context.rank != 3) return;
      float value = 1.0f;  // waits for rank 1 in their pipeline group
      groups.pipeline->all_reduce(context.comm, &value, &value, 1, DType::kFloat32,
                                  Reduction::kSum);
      try {
        context.synchronize();
      } catch (const Error& failure) {
        std::lock_guard lock(mutex);
        seen_by_rank_3 = failure.what();
        throw;
      }
    }, milliseconds(20000));
  });
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));  // not the 20 s timeout
  EXPECT_EQ(error.kind(), ErrorKind::kData) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("rank 1's batch is unreadable"));
  EXPECT_THAT(seen_by_rank_3, HasSubstr("rank 1 failed: rank 1's batch is unreadable"));
  EXPECT_THAT(seen_by_rank_3, HasSubstr("pipeline group of data-parallel index 1 (ranks 1, 3)"));
}

TEST(CommunicatorGroups, ARankThatNeverSplitsIsAMismatchNotAHang) {
  const Error error = capture_error([&] {
    run_world(2, [&](RankContext& context) {
      if (context.rank == 1) return;
      (void)context.communicator.split(0, 0, "everyone");
    });
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("split #0 ('everyone') on rank 0: rank(s) 1 finished "
                                      "without calling it"));
}

TEST(CommunicatorGroups, EachGroupChecksItsOwnCollectiveOrder) {
  const DeviceMesh mesh(4, 2);
  WorldOptions options;
  options.ranks = 4;
  options.timeout = milliseconds(20000);
  options.check_collectives = true;
  std::vector<float> data(8, 1.0f);
  const Error error = capture_error([&] {
    World(options).run([&](RankContext& context) {
      MeshGroups groups = split_mesh(context.communicator, mesh, context.rank);
      float* mine = data.data() + 2 * context.rank;
      // Stage 0's group agrees; in stage 1's, rank 3 issues a barrier where rank 2 reduces.
      if (context.rank == 3) {
        groups.data_parallel->barrier(context.comm);
      } else {
        groups.data_parallel->all_reduce(context.comm, mine, mine, 1, DType::kFloat32,
                                         Reduction::kSum);
      }
      context.synchronize();
    });
  });
  EXPECT_EQ(error.kind(), ErrorKind::kCommMismatch) << error.what();
  EXPECT_THAT(error.what(), HasSubstr("collective order differs between ranks at collective #1 "
                                      "in the data-parallel group of pipeline stage 1 (ranks 2, 3)"));
  EXPECT_THAT(error.what(), HasSubstr("rank 2: all_reduce"));
  EXPECT_THAT(error.what(), HasSubstr("rank 3: barrier"));
}

}  // namespace
}  // namespace zest
