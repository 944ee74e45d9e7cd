// The ZeRO engine's parameter gathering: makes a unit's full flat parameters present for compute
// as the stage plan says. Stage 3 gathers each unit into the gather ring before its forward and
// its backward (on the prefetch stream, so gathers do not queue behind reductions); stages 1-2
// gather every unit's updated shard once after the step, and the next forward waits for a unit's
// gather only when it reaches the unit. Owns the ring, the per-unit events that say a unit's
// parameters are ready again after a step (its gather, or at stage 3 with the optimizer
// offloaded, the copy back of its updated shard), and which units still wait for one.
// Invariant: compute never reads a unit's parameters before the step's gather or copy back of
// that unit has finished: pin() orders it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "engine/gather_ring.h"
#include "engine/secondary_shard.h"
#include "engine/stage_plan.h"
#include "runtime/world.h"

namespace zest {

// Whether stage 3 gathers into a ring at a shard group of `group_size` ranks (the planner asks
// the same): at one rank a shard is its whole unit and is used where it lies.
inline bool gathers_at(int group_size) { return group_size > 1; }

class ParameterGatherer {
 public:
  ParameterGatherer(RankContext& context, const EngineOptions& options, const StagePlan& plan,
                    std::size_t unit_count);

  // Stage 3: allocates the ring (category gather), laid out by gather_ring_layout from the
  // options and the units, and with hpZ the secondary shard (category secondary); no ring
  // in a shard group of one rank (gathers_at), where pin() hands out the shard, which is the
  // whole unit.
  // With offload_param, `fetch_shard` puts a unit's shard into its slot (parameter_offload.h).
  void allocate_ring(const std::vector<FlatUnit>& units, ShardFetch fetch_shard = {});

  // The unit's full flat parameters in the compute dtype, for compute work enqueued next (pinned
  // in a ring slot at stage 3) until unpin().
  void* pin(FlatUnit& unit);
  void unpin(FlatUnit& unit);

  // After `unit`'s updated shard was written on the comm stream (the offloaded optimizer's copy
  // back): stages 1-2 gather the unit now; its next pin() waits for that.
  void shard_updated(FlatUnit& unit);
  // After the optimizer's updates were enqueued on compute: both gathering streams wait for them;
  // stages 1-2 gather every unit now unless `each_unit_reported` (shard_updated() did); the ring
  // forgets what it held (its shards changed).
  void step_done(std::vector<FlatUnit>& units, bool each_unit_reported);
  // The shards changed outside a step (a checkpoint was loaded): the ring forgets what it held.
  void forget();

  // Stage 3: whether `unit`'s gradients live in its gather slot instead of a bucket (the unit
  // allows it and its slot is nobody else's: it is alone in its size class).
  bool gradient_in_slot(const FlatUnit& unit) const;
  // The gradient in `unit`'s slot: zeroed on compute at the first call of a micro-batch, after
  // the work enqueued so far (the last reads of its parameters).
  void* gradient_slot(FlatUnit& unit);
  // After the comm stream's reduction of that gradient was enqueued: the slot is free after it.
  void gradient_reduced(FlatUnit& unit);

  // For tests: how many units the gather ring holds now (stage 3; 0 otherwise).
  std::size_t gathered_units() const { return ring_ ? ring_->resident_count() : 0; }
  // hpZ (engine/secondary_shard.h); null when zero_hpz_partition_size is off.
  const SecondaryShard* secondary() const { return secondary_.get(); }

 private:
  RankContext& context_;
  const EngineOptions& options_;
  const StagePlan& plan_;
  std::unique_ptr<QuantizedGather> quantized_;  // qwZ; before ring_, which points to it
  std::unique_ptr<GatherRing> ring_;
  std::unique_ptr<SecondaryShard> secondary_;  // stage 3 with hpZ
  GatherRingLayout layout_;
  std::vector<std::unique_ptr<Event>> ready_;  // per unit: recorded on comm after its update
  std::vector<bool> awaiting_;                 // per unit: the next pin() waits for ready_
  std::unique_ptr<Event> optimizer_done_;
  std::unique_ptr<Event> serialize_;  // overlap_comm false: gathers wait for compute
};

}  // namespace zest
