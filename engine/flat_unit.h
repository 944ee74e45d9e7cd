// One unit's training state in flat buffers, laid out by its ShardLayout. Which buffers exist,
// and how long they are, follows the stage plan (engine/stage_plan.h; fp32 compute: parameters
// are their own master weights, so no second copy is kept):
//
//   stage | params (category params) | grads (category grads)  | optimizer (master + states)
//   ------+--------------------------+-------------------------+----------------------------
//     0   | full flat                | full flat               | full flat
//     1   | full flat                | full flat               | shard
//     2   | full flat                | shard (+ bucket in bwd) | shard
//     3   | shard (+ gather ring)    | shard (+ bucket in bwd) | shard
//
// Params and grads are in the compute dtype; the optimizer's buffers are fp32. The fp32 master
// copy exists only when the compute dtype is 2-byte.
//
// At stages 2 and 3 a full-unit gradient *bucket* (category buckets, owned by the gradient
// reducer) exists only from the first backward that writes the unit's gradients until its
// reduce-scatter has run; the gather ring belongs to the parameter gatherer.
//
// With the optimizer offloaded (stages 1-3), master and optimizer_state stay empty here: the host
// optimizer (engine/host_optimizer.h) holds them as shards in host memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "memory/shard_layout.h"
#include "engine/module.h"
#include "engine/stage_plan.h"

namespace zest {

// Stages 2-3: the most units whose buckets the host has handed to the comm stream and not yet
// seen freed, when it allocates the next one (one being reduced while backward writes the next).
// The engine keeps to it and the memory planner counts with it.
inline constexpr std::size_t kLiveGradientBuckets = 2;
// Stages 2-3 at one rank, where gradients accumulate into their shard (GradientReducer's
// accumulates_into_shard): the most units whose backward the host has enqueued and not yet
// seen run when it starts the next one's; it starts the first only once the forward has run.
inline constexpr std::size_t kLiveShardTargets = 1;
// There, in forward: the most unit calls the host has enqueued and not yet seen run when it
// starts the next (one running, one queued behind it, so compute never waits for the host).
inline constexpr std::size_t kForwardCallsAhead = 2;

struct FlatUnit {
  Unit* unit = nullptr;  // owned by the Module
  int index = 0;         // in Module::units()
  std::vector<ParamSpec> specs;
  std::vector<int> borrowed;  // units whose parameters this one also reads
  bool gradients_replace_parameters = false;  // Unit::gradients_replace_parameters()
  bool borrows_in_turn = false;                // Unit::borrows_in_turn()
  bool backward_reads_parameters = true;       // Unit::backward_reads_parameters()
  ShardLayout layout;

  Buffer params;     // full flat (stages 0-2) or shard (stage 3), compute dtype
  Buffer master;     // fp32 master weights: full flat (stage 0) or shard; 2-byte compute only
  Buffer grads;      // full flat (stages 0-1) or shard (stages 2-3)
  std::vector<Buffer> optimizer_state;  // full flat (stage 0) or shard (stages 1-3)

  // Ranges of the flat buffer this rank updates, one per parameter piece, with its decay flag.
  struct UpdateRange {
    std::size_t flat_offset = 0;  // where the range starts in the unit's flat buffer
    std::size_t count = 0;
    bool decay = true;
    bool norm_counted = true;  // ParamSpec::norm_counted
  };
  std::vector<UpdateRange> update_ranges;

  std::string param_name(std::size_t index) const { return layout.unit_name() + "." + specs[index].name; }
};

// Builds the layout and the update ranges of `unit` for `rank` under `plan` (no memory yet).
FlatUnit plan_flat_unit(Unit& unit, int index, const StagePlan& plan, int rank, int world_size,
                        std::size_t alignment);

}  // namespace zest
