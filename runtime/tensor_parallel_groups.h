// A rank's two groups on a device mesh with tensor-parallel ranks: the tensor-parallel group its
// model's layers are split across, and the ranks that hold the same slices — the ranks of its
// tensor-parallel index at every pipeline stage and data-parallel index. With one pipeline stage
// that is the data-parallel group, which the ZeRO engine shards within; with several, the
// pipeline (pipeline/pipeline_trainer.h) splits its data-parallel and pipeline groups from it, as
// it does from the world without tensor parallelism. Split from the world's communicator on every
// backend (Communicator::split: local, MPI, NCCL), so a caller builds a tensor-parallel model over
// `tensor` and an Engine or a PipelineTrainer over `data_context`. Invariant: every rank of the
// world calls it at the same point (the splits are collective); destroy it before the world's
// communicator, and the trainer built on data_context before it.
#pragma once

#include <memory>

#include "runtime/communicator.h"
#include "runtime/device_mesh.h"
#include "runtime/world.h"

namespace zest {

struct TensorParallelGroups {
  MeshCoordinate at;                          // this rank's place in the mesh
  std::unique_ptr<Communicator> tensor;       // by tensor-parallel index
  // By pipeline stage × D + data-parallel index: the rank of this rank's tensor-parallel index.
  std::unique_ptr<Communicator> data;
  // The world's context seen from `data`: rank and world_size are the rank and size of `data`
  // (the data-parallel index and size with one pipeline stage), communicator is `data`;
  // world_rank the rank in the world.
  std::unique_ptr<RankContext> data_context;
};

// A kUsage Error when `mesh` does not span the world.
TensorParallelGroups split_tensor_parallel_groups(RankContext& world, const DeviceMesh& mesh);

}  // namespace zest
