#include "runtime/tensor_parallel_groups.h"

#include <string>
#include <vector>

#include "base/error.h"

namespace zest {

namespace {

// With one pipeline stage, the data-parallel group's name; with several, every pipeline stage's.
std::string same_slice_group_name(const DeviceMesh& mesh, int tensor) {
  if (mesh.pipeline_stages() == 1) return mesh.data_parallel_group_name(0, tensor);
  std::vector<int> ranks;
  for (int stage = 0; stage < mesh.pipeline_stages(); ++stage) {
    for (int rank : mesh.data_parallel_group(stage, tensor)) ranks.push_back(rank);
  }
  return "ranks of tensor-parallel index " + std::to_string(tensor) + " (ranks " +
         rank_list_text(ranks) + ")";
}

}  // namespace

TensorParallelGroups split_tensor_parallel_groups(RankContext& world, const DeviceMesh& mesh) {
  if (mesh.world_size() != world.world_size) {
    throw Error(ErrorKind::kUsage, "split_tensor_parallel_groups: needs a mesh over the " +
                                       std::to_string(world.world_size) +
                                       " ranks of the world, got one over " +
                                       std::to_string(mesh.world_size()) + " ranks");
  }
  TensorParallelGroups groups;
  groups.at = mesh.coordinate(world.rank);
  const int pipeline_stage = groups.at.pipeline_stage;
  const int index = groups.at.data_parallel_index;
  const int tensor = groups.at.tensor_parallel_index;
  const int data_parallel = mesh.data_parallel_size();
  // Every rank splits the same groups in the same order (split is collective over the world).
  groups.tensor = world.communicator.split(pipeline_stage * data_parallel + index, tensor,
                                           mesh.tensor_parallel_group_name(pipeline_stage, index));
  groups.data = world.communicator.split(tensor, pipeline_stage * data_parallel + index,
                                         same_slice_group_name(mesh, tensor));
  groups.data_context = std::make_unique<RankContext>(
      RankContext{groups.data->rank(), groups.data->world_size(), world.device, world.compute,
                  world.comm, world.prefetch, *groups.data, world.trace, world.topology, world.wire,
                  1, world.rank_in_world()});
  return groups;
}

}  // namespace zest
