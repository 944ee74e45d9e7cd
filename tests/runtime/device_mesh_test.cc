// The device mesh: the documented rank order (data-parallel index fastest), each rank's groups
// and pipeline neighbours, and one-line kConfig errors for shapes that do not divide.
#include "runtime/device_mesh.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::capture_error;

TEST(DeviceMesh, DataParallelRanksAreConsecutive) {
  const DeviceMesh mesh(8, 2);  // 2 pipeline stages x 4 data-parallel ranks
  EXPECT_EQ(mesh.data_parallel_size(), 4);
  EXPECT_THAT(mesh.data_parallel_group(0), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(mesh.data_parallel_group(1), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(mesh.pipeline_group(1), ElementsAre(1, 5));
  EXPECT_EQ(mesh.coordinate(6), (MeshCoordinate{1, 2}));
  EXPECT_EQ(mesh.rank_of({1, 2}), 6);
}

TEST(DeviceMesh, EveryRankIsInExactlyOneGroupOfEachKind) {
  for (const auto& [ranks, pipeline_stages] :
       std::vector<std::pair<int, int>>{{1, 1}, {4, 1}, {4, 4}, {4, 2}, {6, 3}, {12, 4}}) {
    const DeviceMesh mesh(ranks, pipeline_stages);
    std::multiset<int> in_data_parallel, in_pipeline;
    for (int s = 0; s < pipeline_stages; ++s) {
      for (int r : mesh.data_parallel_group(s)) {
        in_data_parallel.insert(r);
        EXPECT_EQ(mesh.coordinate(r).pipeline_stage, s);
      }
    }
    for (int d = 0; d < mesh.data_parallel_size(); ++d) {
      for (int r : mesh.pipeline_group(d)) {
        in_pipeline.insert(r);
        EXPECT_EQ(mesh.coordinate(r).data_parallel_index, d);
      }
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(in_data_parallel.count(r), 1u) << r;
      EXPECT_EQ(in_pipeline.count(r), 1u) << r;
      EXPECT_EQ(mesh.rank_of(mesh.coordinate(r)), r);
    }
  }
}

TEST(DeviceMesh, NeighboursAreTheSameDataParallelIndexAtAdjacentStages) {
  const DeviceMesh mesh(6, 3);  // pipeline stages of 2: ranks {0,1}, {2,3}, {4,5}
  EXPECT_EQ(mesh.previous_stage_rank(1), std::nullopt);
  EXPECT_EQ(mesh.next_stage_rank(1), 3);
  EXPECT_EQ(mesh.previous_stage_rank(3), 1);
  EXPECT_EQ(mesh.next_stage_rank(3), 5);
  EXPECT_EQ(mesh.previous_stage_rank(4), 2);
  EXPECT_EQ(mesh.next_stage_rank(4), std::nullopt);
}

TEST(DeviceMesh, GroupsNameTheirRanks) {
  const DeviceMesh mesh(4, 2);
  EXPECT_EQ(mesh.data_parallel_group_name(1), "data-parallel group of pipeline stage 1 (ranks 2, 3)");
  EXPECT_EQ(mesh.pipeline_group_name(0), "pipeline group of data-parallel index 0 (ranks 0, 2)");
}

TEST(DeviceMesh, StagesThatDoNotDivideTheRanksAreAOneLineConfigError) {
  const Error error = capture_error([] { DeviceMesh(6, 4); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("pipeline.stages: 4 pipeline stages do not divide world.ranks 6"));
  EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
  EXPECT_EQ(capture_error([] { DeviceMesh(4, 0); }).kind(), ErrorKind::kConfig);
  EXPECT_EQ(capture_error([] { DeviceMesh(0, 1); }).kind(), ErrorKind::kConfig);
  EXPECT_THAT(capture_error([] { DeviceMesh(2, 4); }).what(), HasSubstr("do not divide"));
}

TEST(DeviceMesh, RanksOutsideTheMeshAreUsageErrors) {
  const DeviceMesh mesh(4, 2);
  EXPECT_EQ(capture_error([&] { (void)mesh.coordinate(4); }).kind(), ErrorKind::kUsage);
  EXPECT_EQ(capture_error([&] { (void)mesh.rank_of({2, 0}); }).kind(), ErrorKind::kUsage);
}

TEST(DeviceMesh, TensorParallelRanksAreConsecutiveAndVaryFastest) {
  const DeviceMesh mesh(8, 1, 2);  // 4 data-parallel ranks x 2 tensor-parallel ranks
  EXPECT_EQ(mesh.data_parallel_size(), 4);
  EXPECT_EQ(mesh.tensor_parallel_size(), 2);
  EXPECT_THAT(mesh.tensor_parallel_group(0, 1), ElementsAre(2, 3));
  EXPECT_THAT(mesh.data_parallel_group(0, 1), ElementsAre(1, 3, 5, 7));
  EXPECT_EQ(mesh.coordinate(5), (MeshCoordinate{0, 2, 1}));
  EXPECT_EQ(mesh.rank_of({0, 2, 1}), 5);
  const DeviceMesh staged(8, 2, 2);  // 2 pipeline stages x 2 data-parallel x 2 tensor-parallel
  EXPECT_THAT(staged.pipeline_group(1, 1), ElementsAre(3, 7));
  EXPECT_EQ(staged.next_stage_rank(3), 7);
  EXPECT_EQ(staged.previous_stage_rank(6), 2);
}

TEST(DeviceMesh, EveryRankIsInExactlyOneGroupOfEachKindOnThreeAxes) {
  for (const auto& [ranks, pipeline_stages, tensor] :
       std::vector<std::tuple<int, int, int>>{{4, 1, 4}, {8, 2, 2}, {12, 3, 2}, {16, 2, 4}}) {
    const DeviceMesh mesh(ranks, pipeline_stages, tensor);
    std::multiset<int> in_data_parallel, in_pipeline, in_tensor;
    for (int s = 0; s < pipeline_stages; ++s) {
      for (int t = 0; t < tensor; ++t) {
        for (int r : mesh.data_parallel_group(s, t)) in_data_parallel.insert(r);
      }
      for (int d = 0; d < mesh.data_parallel_size(); ++d) {
        for (int r : mesh.tensor_parallel_group(s, d)) {
          in_tensor.insert(r);
          EXPECT_EQ(mesh.coordinate(r).pipeline_stage, s);
          EXPECT_EQ(mesh.coordinate(r).data_parallel_index, d);
        }
      }
    }
    for (int d = 0; d < mesh.data_parallel_size(); ++d) {
      for (int t = 0; t < tensor; ++t) {
        for (int r : mesh.pipeline_group(d, t)) in_pipeline.insert(r);
      }
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(in_data_parallel.count(r), 1u) << r;
      EXPECT_EQ(in_pipeline.count(r), 1u) << r;
      EXPECT_EQ(in_tensor.count(r), 1u) << r;
      EXPECT_EQ(mesh.rank_of(mesh.coordinate(r)), r);
    }
  }
}

TEST(DeviceMesh, TensorGroupsNameTheirRanks) {
  const DeviceMesh mesh(4, 1, 2);
  EXPECT_EQ(mesh.tensor_parallel_group_name(0, 1),
            "tensor-parallel group of pipeline stage 0, data-parallel index 1 (ranks 2, 3)");
  EXPECT_EQ(mesh.data_parallel_group_name(0, 1),
            "data-parallel group of pipeline stage 0, tensor-parallel index 1 (ranks 1, 3)");
}

TEST(DeviceMesh, TensorSizeThatDoesNotDivideTheRanksIsAOneLineConfigErrorNamingTheNumbers) {
  const Error error = capture_error([] { DeviceMesh(6, 1, 4); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), HasSubstr("tensor_parallel.size: pipeline.stages 1 x "
                                      "tensor_parallel.size 4 = 4 does not divide world.ranks 6"));
  EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
  EXPECT_THAT(capture_error([] { DeviceMesh(8, 2, 3); }).what(), HasSubstr("= 6 does not divide"));
  EXPECT_EQ(capture_error([] { DeviceMesh(4, 1, 0); }).kind(), ErrorKind::kConfig);
}

// A timeout at 5000 ranks waited for some 2800 of them: the message names the first 16 and counts
// the rest, so it stays one short line.
TEST(RankListText, NamesTheFirstSixteenRanksAndCountsTheRest) {
  EXPECT_EQ(rank_list_text({}), "");
  EXPECT_EQ(rank_list_text({3, 1}), "3, 1");
  std::vector<int> many(2800);
  for (int i = 0; i < 2800; ++i) many[static_cast<std::size_t>(i)] = 2200 + i;
  EXPECT_EQ(rank_list_text(many),
            "2200, 2201, 2202, 2203, 2204, 2205, 2206, 2207, 2208, 2209, 2210, 2211, 2212, 2213, "
            "2214, 2215 and 2784 more");
}

}  // namespace
}  // namespace zest
