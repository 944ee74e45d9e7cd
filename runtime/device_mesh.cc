#include "runtime/device_mesh.h"

#include <fmt/format.h>

#include "base/error.h"

namespace zest {

std::string rank_list_text(const std::vector<int>& ranks) {
  // A message stays one short line at thousands of ranks: the first few, then how many more.
  constexpr std::size_t kShown = 16;
  if (ranks.size() <= kShown) return fmt::format("{}", fmt::join(ranks, ", "));
  return fmt::format("{} and {} more", fmt::join(ranks.begin(), ranks.begin() + kShown, ", "),
                     ranks.size() - kShown);
}

DeviceMesh::DeviceMesh(int world_size, int pipeline_stages) {
  if (world_size < 1) {
    throw Error(ErrorKind::kConfig, fmt::format("world.ranks: must be >= 1, got {}", world_size));
  }
  if (pipeline_stages < 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.stages: must be >= 1, got {}", pipeline_stages));
  }
  if (world_size % pipeline_stages != 0) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.stages: {} pipeline stages do not divide world.ranks {}; "
                            "every pipeline stage needs the same number of data-parallel ranks "
                            "(world.ranks a multiple of {})",
                            pipeline_stages, world_size, pipeline_stages));
  }
  pipeline_stages_ = pipeline_stages;
  data_parallel_size_ = world_size / pipeline_stages;
}

void DeviceMesh::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw Error(ErrorKind::kUsage, fmt::format("rank {} is outside the device mesh of {} ranks",
                                               rank, world_size()));
  }
}

MeshCoordinate DeviceMesh::coordinate(int rank) const {
  check_rank(rank);
  return {rank / data_parallel_size_, rank % data_parallel_size_};
}

int DeviceMesh::rank_of(MeshCoordinate coordinate) const {
  if (coordinate.pipeline_stage < 0 || coordinate.pipeline_stage >= pipeline_stages_ ||
      coordinate.data_parallel_index < 0 ||
      coordinate.data_parallel_index >= data_parallel_size_) {
    throw Error(ErrorKind::kUsage,
                fmt::format("(pipeline stage {}, data-parallel index {}) is outside the device "
                            "mesh of {} pipeline stages x {} data-parallel ranks",
                            coordinate.pipeline_stage, coordinate.data_parallel_index,
                            pipeline_stages_, data_parallel_size_));
  }
  return coordinate.pipeline_stage * data_parallel_size_ + coordinate.data_parallel_index;
}

std::vector<int> DeviceMesh::data_parallel_group(int stage) const {
  std::vector<int> ranks;
  for (int index = 0; index < data_parallel_size_; ++index) ranks.push_back(rank_of({stage, index}));
  return ranks;
}

std::vector<int> DeviceMesh::pipeline_group(int index) const {
  std::vector<int> ranks;
  for (int stage = 0; stage < pipeline_stages_; ++stage) ranks.push_back(rank_of({stage, index}));
  return ranks;
}

std::optional<int> DeviceMesh::previous_stage_rank(int rank) const {
  const MeshCoordinate at = coordinate(rank);
  if (at.pipeline_stage == 0) return std::nullopt;
  return rank_of({at.pipeline_stage - 1, at.data_parallel_index});
}

std::optional<int> DeviceMesh::next_stage_rank(int rank) const {
  const MeshCoordinate at = coordinate(rank);
  if (at.pipeline_stage + 1 == pipeline_stages_) return std::nullopt;
  return rank_of({at.pipeline_stage + 1, at.data_parallel_index});
}

std::string DeviceMesh::data_parallel_group_name(int stage) const {
  return fmt::format("data-parallel group of pipeline stage {} (ranks {})", stage,
                     rank_list_text(data_parallel_group(stage)));
}

std::string DeviceMesh::pipeline_group_name(int index) const {
  return fmt::format("pipeline group of data-parallel index {} (ranks {})", index,
                     rank_list_text(pipeline_group(index)));
}

}  // namespace zest
