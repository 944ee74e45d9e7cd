// One rank's trainer for zest-train's config, and what it is built on: the rank's model (the whole
// one, or its tensor-parallel slices), the groups the rank runs in, and the ZeRO engine or the
// pipeline over them. The rows a rank reads follow from the same mesh (runtime/device_mesh.h).
// Invariant: every rank of the world builds its RankTrainer at the same point (the groups are split
// collectively); the members go in reverse order, the trainer before what it borrows.
#pragma once

#include <memory>

#include "config/train_config.h"
#include "data/batch_source.h"
#include "engine/engine.h"
#include "runtime/tensor_parallel_groups.h"
#include "runtime/world.h"

namespace zest {

struct RankTrainer {
  TensorParallelGroups tensor_groups;  // tensor_parallel only; the model and trainer borrow it
  std::unique_ptr<Module> model;       // null with pipeline stages: the pipeline builds its own
  std::unique_ptr<Engine> engine;      // outlives the trainer (Engine::shard's contract)
  std::unique_ptr<Trainer> trainer;
};

// With pipeline stages, a PipelineTrainer (each pipeline stage's units trained by the ZeRO engine
// in its data-parallel group; it accumulates over its micro-batches itself); without, the ZeRO
// engine's trainer. With tensor parallelism either runs over the ranks of this rank's
// tensor-parallel index, on the rank's slices of the GPT (models/tensor_parallel_gpt.h).
RankTrainer make_rank_trainer(RankContext& context, const TrainConfig& config);

// This rank's data-parallel index and their count: every rank of a tensor-parallel group, and
// every pipeline stage, reads the same rows (rank = (pipeline stage × D + index) × T + tensor).
int data_parallel_index(const RankContext& context, const TrainConfig& config);
int data_parallel_size(const TrainConfig& config);

// The rows of a step with pipeline stages: this data-parallel index's share of the global batch,
// every micro-batch at once.
BatchSlice pipeline_slice(const RankContext& context, const TrainConfig& config);

}  // namespace zest
