// Hybrid sharding in the ZeRO engine (zero_optimization.hybrid_shard_size; FSDP's HYBRID_SHARD,
// MiCS): the trainer shards its units over a shard group of consecutive ranks — a node by
// default — and every shard group holds the whole model state, so parameter gathers stay inside
// the group and only each shard's gradient all-reduce crosses between groups. The trainer is the
// plain ZeRO trainer run in its shard group's view of the rank (RankContext: rank, world_size and
// a HybridCommunicator of the shard group); only the step's loss and norm ask `replicas`.
// Invariant: made only where it changes something — stage 1-3 and a shard group smaller than the
// world; a group of the whole world is plain ZeRO, a group of one rank still syncs gradients.
#pragma once

#include "engine/engine.h"
#include "runtime/hybrid_communicator.h"
#include "runtime/world.h"

namespace zest {

// The shard group's size hybrid sharding uses at `stage` over `world_size` data-parallel ranks on
// nodes of `ranks_per_node` world ranks, or 0 when it is off: not asked (0), stage 0 (nothing is
// sharded: gradients are all-reduced over the world as without it), or a group of the whole
// world (one shard group: plain ZeRO). `asked` may be kHybridShardNode (a node's data-parallel
// ranks: with `tensor_ranks` > 1, a node holds ranks_per_node / tensor_ranks of one tensor
// index's). A size that does not divide the world is a kConfig Error, one line.
int hybrid_shard_size(int asked, int stage, int world_size, int ranks_per_node,
                      int tensor_ranks = 1);

class HybridShards {
 public:
  // Splits `world`'s communicator (collective: every rank makes it alike).
  HybridShards(RankContext& world, int shard_size);
  HybridShards(const HybridShards&) = delete;
  HybridShards& operator=(const HybridShards&) = delete;

  RankContext& context() { return context_; }

 private:
  HybridCommunicator communicator_;
  RankContext context_;
};

}  // namespace zest
