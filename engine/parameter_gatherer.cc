#include "engine/parameter_gatherer.h"

#include <algorithm>
#include <utility>

namespace zest {

ParameterGatherer::ParameterGatherer(RankContext& context, const EngineOptions& options,
                                     const StagePlan& plan, std::size_t unit_count)
    : context_(context), options_(options), plan_(plan), awaiting_(unit_count, false) {
  for (std::size_t i = 0; i < unit_count; ++i) ready_.push_back(context.device.create_event());
  optimizer_done_ = context.device.create_event();
  serialize_ = context.device.create_event();
  const int hpz = hpz_group_size(options.hpz_group_size, plan.stage, context.world_size,
                                     context.topology.ranks_per_node());
  if (hpz > 0) secondary_ = std::make_unique<SecondaryShard>(context, hpz, options.compute_dtype);
}

void ParameterGatherer::allocate_ring(const std::vector<FlatUnit>& units, ShardFetch fetch_shard) {
  // Note: a shard group of one rank holds each unit whole in its shard, so the shard itself is
  // handed out (pin's path for stages 1-2) and a ring slot would only copy it: at one rank the
  // GPT's embedding slot alone was 49 MiB of a 500 MiB peak at vocabulary 50257.
  // offload_param: the shards are in host memory, so even one rank fetches into a ring slot.
  const bool offloaded = options_.offload_param.enabled();
  if (!plan_.gathers_before_each_use() || !(gathers_at(context_.world_size) || offloaded)) return;
  GatherRingSizing sizing;
  sizing.minimum_slots = options_.gather_slots;
  sizing.prefetch_elements = options_.stage3_prefetch_bucket_size;
  sizing.max_live_elements = options_.stage3_max_live_parameters;
  for (const FlatUnit& unit : units) {
    sizing.unit_elements.push_back(unit.layout.flat_length());
    sizing.borrowed.push_back(unit.borrowed);
    sizing.borrows_in_turn.push_back(unit.borrows_in_turn);
  }
  layout_ = gather_ring_layout(sizing);
  ring_ = std::make_unique<GatherRing>(context_.device, layout_, options_.compute_dtype,
                                       std::move(fetch_shard));
  if (options_.quantized_weights) {
    std::vector<ShardLayout> layouts;
    for (const FlatUnit& unit : units) layouts.push_back(unit.layout);
    quantized_ = std::make_unique<QuantizedGather>(context_.device, layouts,
                                                   options_.quantization_block);
    ring_->quantize_gathers(quantized_.get());
  }
  if (secondary_) secondary_->allocate(units);
}

bool ParameterGatherer::gradient_in_slot(const FlatUnit& unit) const {
  // Note: one rank with offload_param has a ring only to hold what it fetched; its gradients
  // accumulate into their shard as without one (GradientReducer's accumulates_into_shard).
  return ring_ && gathers_at(context_.world_size) && unit.gradients_replace_parameters &&
         layout_.alone_in_class(unit.index);
}

void* ParameterGatherer::gradient_slot(FlatUnit& unit) {
  return ring_->hold_gradient(unit, context_.device, context_.compute);
}

void ParameterGatherer::gradient_reduced(FlatUnit& unit) {
  ring_->gradient_reduced(unit, context_.comm);
}

void* ParameterGatherer::pin(FlatUnit& unit) {
  const auto index = static_cast<std::size_t>(unit.index);
  if (!ring_) {
    // Stages 1-2: the step's gather of this unit; stage 3 at one rank: the offloaded
    // optimizer's copy back of its shard.
    if (awaiting_[index]) {
      context_.compute.wait(*ready_[index]);
      awaiting_[index] = false;
    }
    return unit.params.data();
  }
  // Gathers run on the prefetch stream, so in backward they do not queue behind the
  // reduce-scatters on the comm stream.
  if (!options_.overlap_comm) {
    context_.compute.record(*serialize_);
    context_.prefetch.wait(*serialize_);
  }
  if (awaiting_[index]) {  // offload: the step's copy of this unit's shard back
    context_.prefetch.wait(*ready_[index]);
    awaiting_[index] = false;
  }
  return ring_->pin(unit, context_.prefetch, context_.compute, context_.communicator,
                    secondary_.get());
}

void ParameterGatherer::unpin(FlatUnit& unit) {
  if (ring_) ring_->unpin(unit, context_.compute);
}

void ParameterGatherer::shard_updated(FlatUnit& unit) {
  Stream& comm = context_.comm;
  if (plan_.gathers_after_step()) {
    const std::size_t shard = unit.layout.shard_length();
    char* params = unit.params.as<char>();
    context_.communicator.label_next(("gather updated " + unit.layout.unit_name()).c_str());
    context_.communicator.all_gather(
        comm, params + context_.rank * shard * dtype_size(options_.compute_dtype), params, shard,
        options_.compute_dtype);
  }
  // Stages 1-2: the next forward (compute) waits for this when it reaches the unit; stage 3: the
  // unit's next gather (prefetch) does.
  comm.record(*ready_[static_cast<std::size_t>(unit.index)]);
  awaiting_[static_cast<std::size_t>(unit.index)] = true;
}

void ParameterGatherer::step_done(std::vector<FlatUnit>& units, bool each_unit_reported) {
  // Both gathering streams must see the updated shards: comm gathers them back now (stages
  // 1-2), prefetch gathers them for the next forward (stage 3).
  context_.compute.record(*optimizer_done_);
  context_.comm.wait(*optimizer_done_);
  context_.prefetch.wait(*optimizer_done_);
  if (!each_unit_reported && plan_.gathers_after_step()) {
    // The next forward waits for each unit's gather only when it reaches the unit, so the
    // gathers of later units overlap the forward of earlier ones.
    for (FlatUnit& unit : units) shard_updated(unit);
  }
  forget();
}

void ParameterGatherer::forget() {
  if (ring_) ring_->clear();
  if (secondary_) secondary_->parameters_changed();
}

}  // namespace zest
