#include "runtime/tensor_parallel_groups.h"

#include <string>

#include "base/error.h"

namespace zest {

TensorParallelGroups split_tensor_parallel_groups(RankContext& world, const DeviceMesh& mesh) {
  if (mesh.pipeline_stages() != 1 || mesh.world_size() != world.world_size) {
    throw Error(ErrorKind::kUsage,
                "split_tensor_parallel_groups: needs a mesh of one pipeline stage over the " +
                    std::to_string(world.world_size) + " ranks of the world, got " +
                    std::to_string(mesh.pipeline_stages()) + " pipeline stages over " +
                    std::to_string(mesh.world_size()) + " ranks");
  }
  TensorParallelGroups groups;
  groups.at = mesh.coordinate(world.rank);
  const int pipeline_stage = groups.at.pipeline_stage;
  const int index = groups.at.data_parallel_index;
  const int tensor = groups.at.tensor_parallel_index;
  // Every rank splits the same groups in the same order (split is collective over the world).
  groups.tensor =
      world.communicator.split(pipeline_stage * mesh.data_parallel_size() + index, tensor,
                               mesh.tensor_parallel_group_name(pipeline_stage, index));
  groups.data =
      world.communicator.split(pipeline_stage * mesh.tensor_parallel_size() + tensor, index,
                               mesh.data_parallel_group_name(pipeline_stage, tensor));
  groups.data_context = std::make_unique<RankContext>(RankContext{
      index, mesh.data_parallel_size(), world.device, world.compute, world.comm, world.prefetch,
      *groups.data, world.trace, world.topology, world.wire, 1, world.rank_in_world()});
  return groups;
}

}  // namespace zest
