// The ZeRO engine's gradient reduction: each micro-batch's gradients to their owners on the comm
// stream, while backward goes on with the earlier units. Follows the stage plan: stages 0-1
// reduce the step's last micro-batch only, in buckets of reduce_bucket_size elements (all-reduce
// at stage 0, reduce-scatter at stage 1); stages 2-3 reduce-scatter every unit as soon as its
// backward ends, from a bucket of the unit's full gradient into its gradient shard (at one rank,
// where the shard is the unit, backward writes the shard itself, and the host is kept close to
// compute instead: accumulates_into_shard). Owns those per-unit buckets (category buckets), the
// events that order each reduction after the backward that wrote it, and the units grouped into
// the bucket being filled.
// Invariant: at most kLiveGradientBuckets per-unit buckets exist at once (one written by backward,
// one being reduced), so stage 2 never holds every unit's full gradients.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "engine/gradient_checks.h"
#include "engine/parameter_gatherer.h"
#include "engine/quantized_collectives.h"
#include "engine/quantized_replicas.h"
#include "engine/stage_plan.h"
#include "runtime/world.h"

namespace zest {

// Whether stages 2-3 accumulate each unit's gradient straight into its gradient shard: in a
// shard group of one rank with no replicas, whose shard is the whole unit, reducing in the
// compute dtype (a mean over one rank is the gradient itself). Else through a per-unit bucket.
// The planner asks the same.
bool accumulates_into_shard(const StagePlan& plan, const EngineOptions& options, int group_size,
                            int replicas);

class GradientReducer {
 public:
  // Called in comm-stream order right after a unit's reduction in the step's last micro-batch,
  // when its gradient shard is final (the offloaded optimizer copies it to the host).
  using FinalShard = std::function<void(FlatUnit&)>;

  // `units` outlives the reducer; `checks` sees each unit's gradient before it is reduced;
  // `gatherer` holds the gradients that live in their gather slot (stage 3).
  GradientReducer(RankContext& context, const EngineOptions& options, const StagePlan& plan,
                  std::vector<FlatUnit>& units, GradientChecks& checks,
                  ParameterGatherer& gatherer, FinalShard final_shard);

  // The full flat gradient buffer a unit's backward accumulates into: its gradients at stages
  // 0-1 and where accumulates_into_shard says so, its bucket (allocated and zeroed on first use
  // in the micro-batch) at stages 2-3, or its gather slot where
  // ParameterGatherer::gradient_in_slot says so.
  void* target(FlatUnit& unit);
  // Around each unit's forward call, in order: where gradients accumulate into their shard
  // (one rank, nothing to overlap), the host starts a call only once compute has run the one
  // before the previous, so the forward's workspaces are freed as it goes (kForwardCallsAhead).
  void forward_call_begins();
  void forward_call_done();
  // Before a micro-batch's backward: whether it is the step's last.
  void backward_begins(bool last_micro_batch);
  // After `unit`'s backward has been enqueued on compute (units in reverse order, unit 0 last):
  // reduces it now or with its bucket, as the plan says.
  void unit_done(FlatUnit& unit);

 private:
  void reduce(FlatUnit& unit);
  void reduce_quantized(FlatUnit& unit, void* source, std::size_t shard, std::size_t first);
  // Until fewer than kLiveGradientBuckets (kLiveShardTargets) are in flight.
  void wait_for_bucket();

  RankContext& context_;
  const EngineOptions& options_;
  const StagePlan& plan_;
  std::vector<FlatUnit>& units_;
  GradientChecks& checks_;
  ParameterGatherer& gatherer_;
  FinalShard final_shard_;
  bool reduce_now_ = false;   // this micro-batch's gradients are reduced
  bool last_micro_batch_ = false;
  std::vector<int> bucket_;   // stages 0-1: units whose gradients wait to be reduced together
  std::size_t bucket_elements_ = 0;
  std::vector<Buffer> unit_buckets_;                     // stages 2-3, per unit, during backward
  std::vector<std::unique_ptr<Event>> backward_done_;    // per unit: its gradients are written
  std::vector<std::unique_ptr<Event>> bucket_released_;  // per unit: its bucket is freed
  std::deque<int> buckets_in_flight_;  // units whose bucket the comm stream has yet to free
  std::unique_ptr<Event> serialize_;   // overlap_comm false: compute waits for each reduction
  std::unique_ptr<QuantizedReduceScatter> quantized_;  // qgZ
  std::unique_ptr<QuantizedReplicaMean> replicas_;     // qgZ with hybrid sharding
  bool into_shard_ = false;            // accumulates_into_shard
  std::vector<bool> targeted_;  // into_shard_: per unit, its shard is this micro-batch's target
  std::unique_ptr<Event> forward_done_;  // into_shard_: compute at backward_begins
  bool forward_pending_ = false;         // the next wait_for_bucket waits for it first
  // into_shard_: the last kForwardCallsAhead forward calls' ends, round-robin
  std::vector<std::unique_ptr<Event>> forward_calls_;
  std::size_t forward_calls_begun_ = 0;
};

}  // namespace zest
