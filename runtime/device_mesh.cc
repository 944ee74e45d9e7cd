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

DeviceMesh::DeviceMesh(int world_size, int pipeline_stages, int tensor_parallel_size) {
  if (world_size < 1) {
    throw Error(ErrorKind::kConfig, fmt::format("world.ranks: must be >= 1, got {}", world_size));
  }
  if (pipeline_stages < 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.stages: must be >= 1, got {}", pipeline_stages));
  }
  if (tensor_parallel_size < 1) {
    throw Error(ErrorKind::kConfig,
                fmt::format("tensor_parallel.size: must be >= 1, got {}", tensor_parallel_size));
  }
  if (world_size % pipeline_stages != 0) {
    throw Error(ErrorKind::kConfig,
                fmt::format("pipeline.stages: {} pipeline stages do not divide world.ranks {}; "
                            "every pipeline stage needs the same number of data-parallel ranks "
                            "(world.ranks a multiple of {})",
                            pipeline_stages, world_size, pipeline_stages));
  }
  if (world_size % (pipeline_stages * tensor_parallel_size) != 0) {
    throw Error(ErrorKind::kConfig,
                fmt::format("tensor_parallel.size: pipeline.stages {} x tensor_parallel.size {} = "
                            "{} does not divide world.ranks {}; world.ranks must be pipeline "
                            "stages x data-parallel ranks x tensor-parallel ranks (a multiple of {})",
                            pipeline_stages, tensor_parallel_size,
                            pipeline_stages * tensor_parallel_size, world_size,
                            pipeline_stages * tensor_parallel_size));
  }
  pipeline_stages_ = pipeline_stages;
  tensor_parallel_size_ = tensor_parallel_size;
  data_parallel_size_ = world_size / (pipeline_stages * tensor_parallel_size);
}

void DeviceMesh::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw Error(ErrorKind::kUsage, fmt::format("rank {} is outside the device mesh of {} ranks",
                                               rank, world_size()));
  }
}

MeshCoordinate DeviceMesh::coordinate(int rank) const {
  check_rank(rank);
  const int slice = rank / tensor_parallel_size_;
  return {slice / data_parallel_size_, slice % data_parallel_size_, rank % tensor_parallel_size_};
}

int DeviceMesh::rank_of(MeshCoordinate coordinate) const {
  if (coordinate.pipeline_stage < 0 || coordinate.pipeline_stage >= pipeline_stages_ ||
      coordinate.data_parallel_index < 0 ||
      coordinate.data_parallel_index >= data_parallel_size_ ||
      coordinate.tensor_parallel_index < 0 ||
      coordinate.tensor_parallel_index >= tensor_parallel_size_) {
    throw Error(ErrorKind::kUsage,
                fmt::format("(pipeline stage {}, data-parallel index {}, tensor-parallel index {}) "
                            "is outside the device mesh of {} pipeline stages x {} data-parallel "
                            "ranks x {} tensor-parallel ranks",
                            coordinate.pipeline_stage, coordinate.data_parallel_index,
                            coordinate.tensor_parallel_index, pipeline_stages_,
                            data_parallel_size_, tensor_parallel_size_));
  }
  return (coordinate.pipeline_stage * data_parallel_size_ + coordinate.data_parallel_index) *
             tensor_parallel_size_ +
         coordinate.tensor_parallel_index;
}

std::vector<int> DeviceMesh::data_parallel_group(int pipeline_stage, int tensor) const {
  std::vector<int> ranks;
  for (int index = 0; index < data_parallel_size_; ++index) {
    ranks.push_back(rank_of({pipeline_stage, index, tensor}));
  }
  return ranks;
}

std::vector<int> DeviceMesh::pipeline_group(int index, int tensor) const {
  std::vector<int> ranks;
  for (int pipeline_stage = 0; pipeline_stage < pipeline_stages_; ++pipeline_stage) {
    ranks.push_back(rank_of({pipeline_stage, index, tensor}));
  }
  return ranks;
}

std::vector<int> DeviceMesh::tensor_parallel_group(int pipeline_stage, int index) const {
  std::vector<int> ranks;
  for (int tensor = 0; tensor < tensor_parallel_size_; ++tensor) {
    ranks.push_back(rank_of({pipeline_stage, index, tensor}));
  }
  return ranks;
}

std::optional<int> DeviceMesh::previous_stage_rank(int rank) const {
  MeshCoordinate at = coordinate(rank);
  if (at.pipeline_stage == 0) return std::nullopt;
  --at.pipeline_stage;
  return rank_of(at);
}

std::optional<int> DeviceMesh::next_stage_rank(int rank) const {
  MeshCoordinate at = coordinate(rank);
  if (at.pipeline_stage + 1 == pipeline_stages_) return std::nullopt;
  ++at.pipeline_stage;
  return rank_of(at);
}

std::string DeviceMesh::data_parallel_group_name(int pipeline_stage, int tensor) const {
  const std::string of_tensor =
      tensor_parallel_size_ > 1 ? fmt::format(", tensor-parallel index {}", tensor) : "";
  return fmt::format("data-parallel group of pipeline stage {}{} (ranks {})", pipeline_stage,
                     of_tensor, rank_list_text(data_parallel_group(pipeline_stage, tensor)));
}

std::string DeviceMesh::pipeline_group_name(int index, int tensor) const {
  const std::string of_tensor =
      tensor_parallel_size_ > 1 ? fmt::format(", tensor-parallel index {}", tensor) : "";
  return fmt::format("pipeline group of data-parallel index {}{} (ranks {})", index, of_tensor,
                     rank_list_text(pipeline_group(index, tensor)));
}

std::string DeviceMesh::tensor_parallel_group_name(int pipeline_stage, int index) const {
  return fmt::format(
      "tensor-parallel group of pipeline stage {}, data-parallel index {} (ranks {})",
      pipeline_stage, index, rank_list_text(tensor_parallel_group(pipeline_stage, index)));
}

}  // namespace zest
