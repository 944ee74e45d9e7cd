#include "engine/hybrid_shards.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"
#include "engine/stage_plan.h"

namespace zest {

int hybrid_shard_size(int asked, int stage, int world_size, int ranks_per_node, int tensor_ranks) {
  if (asked == 0) return 0;
  if (asked == kHybridShardNode) asked = std::max(1, ranks_per_node / tensor_ranks);
  if (asked < 0 || world_size % asked != 0) {
    throw Error(ErrorKind::kConfig,
                fmt::format("zero_optimization.hybrid_shard_size: {} does not divide the {} "
                            "data-parallel ranks; shard groups must be equal (a divisor of {})",
                            asked, world_size, world_size));
  }
  // Note: the FSDP pitfall is a mesh dimension of 1 that silently stops the all-reduce across
  // it. Here a group of the whole world is not a hybrid mesh at all (plain ZeRO, no replica
  // group to forget), and a group of one rank keeps its replica all-reduce over every rank.
  if (!StagePlan::of(stage).optimizer_sharded || asked == world_size) return 0;
  return asked;
}

HybridShards::HybridShards(RankContext& world, int shard_size)
    : communicator_(world.communicator, shard_size),
      context_{communicator_.rank(), communicator_.world_size(), world.device, world.compute,
               world.comm,           world.prefetch,            communicator_, world.trace,
               world.topology,       world.wire,                communicator_.replicas(),
               world.rank_in_world()} {}

RankContext& Engine::trainer_context(const Module& module) {
  // With tensor parallelism this engine runs on one tensor index's data-parallel ranks.
  const Communicator* tensor = module.tensor_parallel_group();
  const int size =
      hybrid_shard_size(options_.hybrid_shard_size, options_.stage, context_.world_size,
                        context_.topology.ranks_per_node(), tensor ? tensor->world_size() : 1);
  if (size == 0) return context_;
  if (!hybrid_) hybrid_ = std::make_shared<HybridShards>(context_, size);
  return hybrid_->context();
}

}  // namespace zest
