// A rank's two groups on a device mesh of data-parallel × tensor-parallel ranks (one pipeline
// stage): the tensor-parallel group its model's layers are split across, and the data-parallel
// group of the ranks that hold the same slices, which the ZeRO engine shards within. Split from
// the world's communicator on every backend (Communicator::split: local, MPI, NCCL), so a caller
// builds a tensor-parallel model over `tensor` and an Engine over `data_context`. Invariant:
// every rank of the world calls it at the same point (the splits are collective); destroy it
// before the world's communicator, and the trainer built on data_context before it.
#pragma once

#include <memory>

#include "runtime/communicator.h"
#include "runtime/device_mesh.h"
#include "runtime/world.h"

namespace zest {

struct TensorParallelGroups {
  MeshCoordinate at;                          // this rank's place in the mesh
  std::unique_ptr<Communicator> tensor;       // by tensor-parallel index
  std::unique_ptr<Communicator> data;         // by data-parallel index
  // The world's context seen from the data-parallel group: rank and world_size are the
  // data-parallel index and size, communicator is `data`; world_rank the rank in the world.
  std::unique_ptr<RankContext> data_context;
};

// A kUsage Error when `mesh` has pipeline stages (pipeline/pipeline_trainer.h splits its own) or
// does not span the world.
TensorParallelGroups split_tensor_parallel_groups(RankContext& world, const DeviceMesh& mesh);

}  // namespace zest
