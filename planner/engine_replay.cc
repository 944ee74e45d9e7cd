#include "planner/engine_replay.h"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.h"
#include "kernels/gradient_statistics.h"
#include "memory/shard_layout.h"
#include "engine/flat_unit.h"
#include "engine/gather_ring.h"
#include "engine/gradient_reducer.h"
#include "engine/parameter_gatherer.h"
#include "engine/quantized_collectives.h"
#include "engine/quantized_replicas.h"
#include "engine/secondary_partition.h"

namespace zest {
namespace {
using LedgerStream = PeakLedger::Stream;
constexpr PeakLedger::Handle kNone = PeakLedger::kNone;
}  // namespace

EngineReplay::EngineReplay(const PeakPlanInput& input, PeakLedger& ledger, std::size_t copies,
                           StreamScratch* shared)
    : input_(input), options_(input.engine), plan_(StagePlan::of(input.engine.stage)),
      into_shard_(accumulates_into_shard(plan_, options_, input.world_size, input.replicas)),
      ledger_(ledger), stream_scratch_(shared ? *shared : own_scratch_) {
  for (std::size_t u = 0; u < input.model.units.size(); ++u) {
    const UnitShapes& shapes = input.model.units[u];
    const ShardLayout layout =
        ShardLayout::build(shapes.name, shapes.params, input.world_size, input.model.alignment);
    PlannedUnit unit{layout.flat_length(), layout.shard_length(), shapes.borrowed, {},
                     shapes.gradients_replace_parameters, false, RecomputePolicy::kNone, false};
    unit.borrows_in_turn = shapes.borrows_in_turn;
    unit.backward_reads_parameters = shapes.backward_reads_parameters;
    if (u < input.units.size()) unit.memory = input.units[u];
    unit.runs = u >= copies;
    units_.push_back(std::move(unit));
  }
  if (!input.units.empty()) {
    std::vector<Recomputable> recomputable;
    for (const PlannedUnit& unit : units_) {
      recomputable.push_back({!unit.replaces_parameters, unit.memory.selective});
    }
    const std::vector<RecomputePolicy> recompute =
        input.recompute.size() == units_.size()
            ? input.recompute
            : plan_recompute(options_.activation_checkpointing, recomputable);
    for (std::size_t u = 0; u < units_.size(); ++u) units_[u].recompute = recompute[u];
    if (options_.activation_checkpointing.cpu_checkpointing) {
      for (std::size_t u = 1; u < units_.size(); ++u) {
        units_[u].input_offloaded = recompute[u] != RecomputePolicy::kNone;
        if (units_[u].input_offloaded) checkpoint_host_bytes_ += units_[u - 1].memory.output;
      }
    }
  }
  fetched_.assign(units_.size(), 0);
  const std::size_t n = units_.size();
  outputs_.assign(n, kNone);
  grad_inputs_.assign(n, kNone);
  saved_.assign(n, kNone);
  split_.assign(n, kNone);
  held_saved_.assign(n, {});
  buckets_.assign(n, kNone);
  bucket_released_.assign(n, 0);
  targeted_.assign(n, false);
}

std::size_t EngineReplay::largest_shard() const {
  std::size_t largest = 0;
  for (const PlannedUnit& unit : units_) largest = std::max(largest, unit.shard);
  return largest;
}

void EngineReplay::construct() {
  const MemoryPrediction state =
      predict_model_state(input_.model, options_.stage, input_.world_size,
                          options_.offload_optimizer.enabled(), options_.offload_param);
  ledger_.allocate(state.params, Category::kParams);
  ledger_.allocate(state.grads, Category::kGrads);
  ledger_.allocate(state.optimizer, Category::kOptimizer);
  if (input_.model_state_only) return;
  // ParameterGatherer::allocate_ring: offloaded parameters are fetched into a ring at one rank too.
  if (plan_.gathers_before_each_use() &&
      (gathers_at(input_.world_size) || options_.offload_param.enabled())) {
    GatherRingSizing sizing;
    sizing.minimum_slots = options_.gather_slots;
    sizing.prefetch_elements = options_.stage3_prefetch_bucket_size;
    sizing.max_live_elements = options_.stage3_max_live_parameters;
    for (const PlannedUnit& unit : units_) {
      sizing.unit_elements.push_back(unit.full);
      sizing.borrowed.push_back(unit.borrowed);
      sizing.borrows_in_turn.push_back(unit.borrows_in_turn);
    }
    const GatherRingLayout layout = gather_ring_layout(sizing);
    for (const GatherRingLayout::SizeClass& size_class : layout.classes) {
      for (std::size_t s = 0; s < size_class.slots; ++s) {
        ledger_.allocate(size_class.slot_elements * element(), Category::kGather);
      }
    }
    // ParameterGatherer::allocate_ring: qwZ's staging buffer after the ring.
    if (options_.quantized_weights) {
      std::vector<ShardLayout> layouts;
      for (const UnitShapes& shapes : input_.model.units) {
        layouts.push_back(ShardLayout::build(shapes.name, shapes.params, input_.world_size,
                                             input_.model.alignment));
      }
      ledger_.allocate(quantized_gather_bytes(layouts, options_.quantization_block),
                       Category::kGather);
    }
    // ParameterGatherer's secondary partition (hpZ): 1/h of each unit, for the whole run.
    const int hpz = hpz_partition_size(options_.hpz_partition_size, options_.stage,
                                       input_.world_size, input_.world_size);
    for (const PlannedUnit& unit : units_) {
      if (hpz == 0) break;
      ledger_.allocate(unit.full / static_cast<std::size_t>(hpz) * element(), Category::kSecondary);
    }
    // ParameterGatherer::gradient_in_slot: such a unit's gradient costs no bucket.
    for (std::size_t u = 0; u < units_.size() && gathers_at(input_.world_size); ++u) {
      units_[u].gradient_in_slot = units_[u].replaces_parameters &&
                                   layout.alone_in_class(static_cast<int>(u));
    }
  }
  // GradientReducer's constructor: qgZ's buffers, wherever gradients are reduce-scattered.
  if (options_.quantized_gradients && plan_.reduction == GradientReduction::kReduceScatter) {
    for (std::size_t bytes :
         quantized_reduction_bytes(largest_shard(), input_.world_size,
                                   options_.quantization_block, options_.quantized_gradient_bits)) {
      ledger_.allocate(bytes, Category::kBuckets);
    }
    // With hybrid sharding, then its mean across the replicas (engine/quantized_replicas.h).
    for (std::size_t bytes : input_.replicas > 1
                                 ? quantized_replica_bytes(largest_shard(), input_.replicas,
                                                           options_.quantization_block,
                                                           options_.quantized_gradient_bits)
                                 : std::vector<std::size_t>{}) {
      ledger_.allocate(bytes, Category::kBuckets);
    }
  }
  ledger_.allocate(sizeof(float), Category::kWorkspace);  // the loss
  // The gradient checks: a slot per unit and one for the step's norm.
  ledger_.allocate((units_.size() + 1) * sizeof(GradientStatistics), Category::kWorkspace);
}

void EngineReplay::gradient_target(int u) {
  if (!plan_.reduce_per_unit || buckets_[u] != kNone || targeted_[u]) return;
  if (forward_pending_) {  // GradientReducer::wait_for_bucket
    ledger_.synchronize(LedgerStream::kCompute, forward_done_);
    forward_pending_ = false;
  }
  const std::size_t live = into_shard_ ? kLiveShardTargets : kLiveGradientBuckets;
  while (buckets_in_flight_.size() >= live) {
    ledger_.synchronize(LedgerStream::kComm, bucket_released_[buckets_in_flight_.front()]);
    buckets_in_flight_.pop_front();
  }
  if (into_shard_) {  // GradientReducer::target: the wait, no bucket
    targeted_[u] = true;
    return;
  }
  buckets_[u] = ledger_.allocate(units_[u].full * element(), Category::kBuckets);
}

std::vector<int> EngineReplay::call_members(int u) const {
  std::vector<int> members{u};
  // A unit that borrows in turn pins its lenders inside the call (borrow_in_turn below).
  if (units_[u].borrows_in_turn) return members;
  members.insert(members.end(), units_[u].borrowed.begin(), units_[u].borrowed.end());
  return members;
}

void EngineReplay::borrow_in_turn(int u, bool backward) {
  // BorrowedUnits::pin / unpin (engine/borrowed_units.h): a 2-byte lender's fp32 copy from its
  // pin to its unpin, one lender after another (forward in order, backward in reverse, as the
  // GPT's head).
  if (!units_[u].borrows_in_turn || !two_byte()) return;
  std::vector<int> lenders = units_[u].borrowed;
  if (backward) std::reverse(lenders.begin(), lenders.end());
  for (int lender : lenders) {
    ledger_.release_on(LedgerStream::kCompute, ledger_.allocate(units_[lender].full * sizeof(float),
                                                          Category::kWorkspace));
  }
}

void EngineReplay::prepare(int u, bool backward, std::vector<Handle>& scratch) {
  const std::vector<int> members = call_members(u);
  for (int member : members) {
    const std::size_t fp32_bytes = units_[member].full * sizeof(float);
    // ZeroTrainer::prepare_call: a backward that reads no parameter has no copy of them.
    const PlannedUnit& unit = units_[member];
    const bool pinned = member != u || !backward || unit.backward_reads_parameters ||
                        unit.recompute != RecomputePolicy::kNone || unit.gradient_in_slot;
    if (two_byte() && pinned) scratch.push_back(ledger_.allocate(fp32_bytes, Category::kWorkspace));
    if (!backward || units_[member].gradient_in_slot) continue;
    gradient_target(member);
    if (two_byte()) scratch.push_back(ledger_.allocate(fp32_bytes, Category::kWorkspace));
  }
}

void EngineReplay::wait_for_lagging_call() {
  if (!on_cuda() && recomputed_calls_ >= kRecomputeLag) {
    ledger_.synchronize(LedgerStream::kCompute, lag_positions_[recomputed_calls_ % kRecomputeLag]);
  }
  // CheckpointOffload::bound_copies
  while (!copies_in_flight_.empty()) {
    if (!on_cuda()) ledger_.synchronize(LedgerStream::kCopy, copies_in_flight_.front());
    copies_in_flight_.pop_front();
  }
}

void EngineReplay::recomputed_call_done() {
  if (on_cuda()) return;
  lag_positions_[recomputed_calls_ % kRecomputeLag] = ledger_.record(LedgerStream::kCompute);
  ++recomputed_calls_;
}

void EngineReplay::forward() {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (!units_[u].runs) continue;  // ZeroTrainer::forward_unit: a lent copy runs nothing
    const RecomputePolicy recompute = units_[u].recompute;
    if (into_shard_ && forward_calls_begun_ >= kForwardCallsAhead) {
      ledger_.synchronize(LedgerStream::kCompute,
                          forward_calls_[forward_calls_begun_ % kForwardCallsAhead]);
    }
    if (recompute != RecomputePolicy::kNone) wait_for_lagging_call();
    std::vector<Handle> scratch;
    prepare(static_cast<int>(u), false, scratch);
    const UnitMemory& memory = units_[u].memory;
    if (recompute == RecomputePolicy::kSelective) {
      // GptBlock::forward: the kept part, then the part recompute() rebuilds, dropped at the end.
      saved_[u] = ledger_.allocate(memory.selective_saved, Category::kActivations);
      scratch.push_back(ledger_.allocate(memory.selective_rebuilt, Category::kActivations));
      scratch.push_back(ledger_.allocate(memory.selective_forward_workspace, Category::kWorkspace));
    } else {
      saved_[u] = ledger_.allocate(memory.saved, Category::kActivations);
      // A fully recomputed unit keeps nothing: backward_follows() is false in its first forward.
      if (recompute == RecomputePolicy::kFull) scratch.push_back(std::exchange(saved_[u], kNone));
      scratch.push_back(ledger_.allocate(memory.forward_workspace, Category::kWorkspace));
    }
    borrow_in_turn(static_cast<int>(u), false);
    outputs_[u] = ledger_.allocate(memory.output, Category::kActivations);
    grow_stream_scratch(memory.forward_stream_scratch);
    for (Handle handle : scratch) ledger_.release_on(LedgerStream::kCompute, handle);
    if (units_[u].input_offloaded) {
      // CheckpointOffload::offload: the copy waits for compute, the device buffer goes after it.
      ledger_.wait(LedgerStream::kCopy, LedgerStream::kCompute, ledger_.record(LedgerStream::kCompute));
      ledger_.release_on(LedgerStream::kCopy, std::exchange(outputs_[u - 1], kNone));
      copies_in_flight_.push_back(ledger_.record(LedgerStream::kCopy));
    }
    if (recompute != RecomputePolicy::kNone) recomputed_call_done();
    if (into_shard_) {
      forward_calls_[forward_calls_begun_ % kForwardCallsAhead] =
          ledger_.record(LedgerStream::kCompute);
      ++forward_calls_begun_;
    }
  }
}

void EngineReplay::backward_begins() {
  if (!into_shard_) return;
  forward_done_ = ledger_.record(LedgerStream::kCompute);
  forward_pending_ = true;
  forward_calls_begun_ = 0;
}

void EngineReplay::backward(bool reduce_now) {
  backward_begins();
  Bucket bucket;
  const int last = static_cast<int>(units_.size()) - 1;
  for (int u = last; u >= 0; --u) {
    if (!units_[u].runs) {  // a lent copy: only its gradient is reduced
      unit_done(u, reduce_now, bucket);
      continue;
    }
    const RecomputePolicy recompute = units_[u].recompute;
    if (u >= 2 && units_[u - 1].input_offloaded) {  // CheckpointOffload::fetch, a unit ahead
      outputs_[u - 2] = ledger_.allocate(units_[u - 2].memory.output, Category::kActivations);
      fetched_[u - 2] = ledger_.record(LedgerStream::kCopy);
    }
    // ZeroTrainer::prepare_call: the wait comes after the pins (which allocate nothing) and
    // before the call's views.
    if (recompute != RecomputePolicy::kNone) wait_for_lagging_call();
    std::vector<Handle> scratch;
    prepare(u, true, scratch);
    if (units_[u].input_offloaded) ledger_.wait(LedgerStream::kCompute, LedgerStream::kCopy, fetched_[u - 1]);
    const UnitMemory& memory = units_[u].memory;
    if (recompute == RecomputePolicy::kFull) {
      // The forward again, in the same call: its output is written over the first one's.
      saved_[u] = ledger_.allocate(memory.saved, Category::kActivations);
      ledger_.release_on(LedgerStream::kCompute,
                         ledger_.allocate(memory.forward_workspace, Category::kWorkspace));
      grow_stream_scratch(memory.forward_stream_scratch);
    } else if (recompute == RecomputePolicy::kSelective) {
      scratch.push_back(ledger_.allocate(memory.selective_rebuilt, Category::kActivations));
      ledger_.release_on(LedgerStream::kCompute,
                         ledger_.allocate(memory.rebuild_workspace, Category::kWorkspace));
      grow_stream_scratch(memory.rebuild_stream_scratch);
    }
    grad_inputs_[u] = ledger_.allocate(memory.grad_input, Category::kActivations);
    const std::size_t workspace =
        memory.backward_workspace - (on_cuda() ? memory.backward_workspace_cpu_only : 0);
    scratch.push_back(ledger_.allocate(workspace, Category::kWorkspace));
    borrow_in_turn(u, true);
    // ZeroTrainer::Context::grad: a gradient in its gather slot gets its fp32 accumulator when the
    // unit first asks for it, after the unit's own allocations.
    for (int member : call_members(u)) {
      if (!two_byte() || !units_[member].gradient_in_slot) continue;
      scratch.push_back(ledger_.allocate(units_[member].full * sizeof(float), Category::kWorkspace));
    }
    grow_stream_scratch(memory.backward_stream_scratch);
    release_saved(u, scratch);
    for (Handle handle : scratch) ledger_.release_on(LedgerStream::kCompute, handle);
    ledger_.release_on(LedgerStream::kCompute, std::exchange(outputs_[u], kNone));
    if (u < last) ledger_.release_on(LedgerStream::kCompute, std::exchange(grad_inputs_[u + 1], kNone));
    if (recompute != RecomputePolicy::kNone) recomputed_call_done();
    unit_done(u, reduce_now, bucket);
  }
}

void EngineReplay::release_saved(int u, std::vector<Handle>& scratch) {
  const int freed_by = units_[u].memory.saved_freed_by;
  if (freed_by >= 0 && freed_by != u) {
    held_saved_[static_cast<std::size_t>(freed_by)].push_back(std::exchange(saved_[u], kNone));
  } else {
    scratch.push_back(std::exchange(saved_[u], kNone));
  }
  for (Handle held : held_saved_[static_cast<std::size_t>(u)]) scratch.push_back(held);
  held_saved_[static_cast<std::size_t>(u)].clear();
}

void EngineReplay::unit_done(int u, bool reduce_now, Bucket& bucket) {
  if (!reduce_now) return;
  bucket.units.push_back(u);
  bucket.elements += units_[u].full;
  if (plan_.reduce_per_unit || bucket.elements >= options_.reduce_bucket_size || u == 0) {
    for (int member : bucket.units) reduce(member);
    bucket = {};
    if (!options_.overlap_comm) {
      ledger_.wait(LedgerStream::kCompute, LedgerStream::kComm, ledger_.record(LedgerStream::kComm));
    }
  }
}

int EngineReplay::first_running() const {
  int first = 0;
  while (first + 1 < static_cast<int>(units_.size()) && !units_[first].runs) ++first;
  return first;
}

void EngineReplay::reduce(int u) {
  ledger_.wait(LedgerStream::kComm, LedgerStream::kCompute, ledger_.record(LedgerStream::kCompute));
  if (options_.communication_dtype != options_.compute_dtype) {
    const std::size_t bytes = units_[u].full * dtype_size(options_.communication_dtype);
    ledger_.release_on(LedgerStream::kComm, ledger_.allocate(bytes, Category::kBuckets));
  }
  if (plan_.reduce_per_unit && into_shard_) {
    targeted_[u] = false;
    bucket_released_[u] = ledger_.record(LedgerStream::kComm);
    buckets_in_flight_.push_back(u);
  } else if (plan_.reduce_per_unit && !units_[u].gradient_in_slot) {
    ledger_.release_on(LedgerStream::kComm, std::exchange(buckets_[u], kNone));
    bucket_released_[u] = ledger_.record(LedgerStream::kComm);
    buckets_in_flight_.push_back(u);
  }
}

void EngineReplay::grow_stream_scratch(std::size_t bytes) {
  if (!on_cuda() || bytes <= stream_scratch_.bytes) return;
  ledger_.release_on(LedgerStream::kCompute, std::exchange(stream_scratch_.handle, kNone));
  stream_scratch_.handle = ledger_.allocate(bytes, Category::kWorkspace);
  stream_scratch_.bytes = bytes;
}

void EngineReplay::micro_batch(bool last) {
  // engine/device_batch.h: a CUDA device copies the batch in first and frees it after backward.
  const Handle batch =
      on_cuda() ? ledger_.allocate(input_.batch_bytes, Category::kActivations) : kNone;
  recomputed_calls_ = 0;
  forward();
  backward(plan_.reduce_every_micro_batch || last);
  ledger_.release_on(LedgerStream::kCompute, std::exchange(grad_inputs_[first_running()], kNone));
  ledger_.release_on(LedgerStream::kCompute, batch);
  ledger_.synchronize(LedgerStream::kCompute);  // forward_backward reads the loss
}

void EngineReplay::step() {
  ledger_.synchronize(LedgerStream::kComm);
  if (!options_.offload_optimizer.enabled()) {
    // ZeroTrainer::update_unit: each unit's 2-byte gradients widened to fp32 for the optimizer,
    // then (offload_param) the device copy of its shard that the optimizer updates.
    for (const PlannedUnit& unit : units_) {
      const std::size_t length = plan_.optimizer_length(unit.full, unit.shard);
      const Handle widened =
          two_byte() ? ledger_.allocate(length * sizeof(float), Category::kWorkspace) : kNone;
      if (options_.offload_param.enabled()) {
        ledger_.release_on(LedgerStream::kCompute,
                           ledger_.allocate(unit.shard * element(), Category::kWorkspace));
      }
      if (widened != kNone) ledger_.release_on(LedgerStream::kCompute, widened);
    }
  }
  // ParameterGatherer::step_done: comm waits for the optimizer.
  ledger_.wait(LedgerStream::kComm, LedgerStream::kCompute, ledger_.record(LedgerStream::kCompute));
  if (input_.synchronize_between_steps) ledger_.synchronize(LedgerStream::kComm);
}

PeakPrediction EngineReplay::result() const {
  PeakPrediction prediction;
  for (Category category : all_categories()) {
    prediction.peak[static_cast<std::size_t>(category)] = ledger_.peak_of(category);
  }
  prediction.device_total = ledger_.total_peak();
  prediction.model_state =
      predict_model_state(input_.model, options_.stage, input_.world_size,
                          options_.offload_optimizer.enabled(), options_.offload_param);
  // The replay knows offload_param's swap files from the memory table (the optimizer's are
  // laid out by sub-group only in the engine).
  prediction.nvme[static_cast<std::size_t>(Category::kParams)] = prediction.model_state.nvme_params;
  prediction.peak[static_cast<std::size_t>(Category::kOffload)] =
      prediction.model_state.offload + checkpoint_host_bytes_;
  // The host tier holds only what lives there for the whole run, so its peak is its sum.
  prediction.set_host(Category::kOffload, prediction.of(Category::kOffload));
  prediction.set_host(Category::kParams, prediction.model_state.host_params);
  return prediction;
}


// The pipeline-stage calls (pipeline/stage_runner.cc): each micro-batch in flight holds
// its own outputs and saved activations, swapped in for its backward.
EngineReplay::Held EngineReplay::take() {
  Held held{std::move(outputs_), std::move(grad_inputs_), std::move(saved_), std::move(split_),
            std::move(held_saved_)};
  const std::size_t n = units_.size();
  outputs_.assign(n, kNone);
  grad_inputs_.assign(n, kNone);
  saved_.assign(n, kNone);
  split_.assign(n, kNone);
  held_saved_.assign(n, {});
  return held;
}

void EngineReplay::load(Held held) {
  outputs_ = std::move(held.outputs);
  grad_inputs_ = std::move(held.grad_inputs);
  saved_ = std::move(held.saved);
  split_ = std::move(held.split);
  held_saved_ = std::move(held.saved_by);
}

namespace {
template <typename List>
auto take_held(List& list, int micro_batch) {
  const auto at = std::find_if(list.begin(), list.end(),
                               [&](const auto& entry) { return entry.first == micro_batch; });
  if (at == list.end()) {
    throw Error(ErrorKind::kInternal, "pipeline plan: micro-batch " + std::to_string(micro_batch) +
                                          " replayed out of order");
  }
  auto held = std::move(at->second);
  list.erase(at);
  return held;
}
}  // namespace

void EngineReplay::forward_micro_batch(int micro_batch) {
  if (!loss_slots_) {  // StageRunner::forward: each micro-batch's loss, kept
    const auto count = static_cast<std::size_t>(std::max(options_.gradient_accumulation_steps, 1));
    ledger_.allocate(count * sizeof(float), Category::kWorkspace);
    loss_slots_ = true;
  }
  recomputed_calls_ = 0;
  forward();
  in_flight_.emplace_back(micro_batch, take());
}

EngineReplay::Handle EngineReplay::backward_micro_batch(int micro_batch, bool reduce_now) {
  load(take_held(in_flight_, micro_batch));
  recomputed_calls_ = 0;
  backward(reduce_now);
  const Handle grad_input = std::exchange(grad_inputs_[first_running()], kNone);
  take();
  return grad_input;
}

bool EngineReplay::splits_backward() const {
  for (const PlannedUnit& unit : units_) {
    if (unit.runs && (!unit.memory.split_backward || unit.recompute != RecomputePolicy::kNone)) {
      return false;
    }
  }
  return true;
}

EngineReplay::Handle EngineReplay::backward_input_micro_batch(int micro_batch) {
  load(take_held(in_flight_, micro_batch));
  const int last = static_cast<int>(units_.size()) - 1;
  for (int u = last; u >= 0; --u) {
    if (!units_[u].runs) continue;
    // Not a backward call for the engine: no gradient target is made.
    std::vector<Handle> scratch;
    prepare(u, false, scratch);
    const UnitMemory& memory = units_[u].memory;
    // The unit's backward_input: what it keeps for its weight gradient (its backward workspace
    // and more, category activations), then the input gradient.
    std::size_t kept = memory.split_kept;
    if (memory.split_keeps_workspace) {
      kept += memory.backward_workspace - (on_cuda() ? memory.backward_workspace_cpu_only : 0);
    }
    split_[u] = ledger_.allocate(kept, Category::kActivations);
    grad_inputs_[u] = ledger_.allocate(memory.grad_input, Category::kActivations);
    grow_stream_scratch(memory.backward_stream_scratch);
    for (Handle handle : scratch) ledger_.release_on(LedgerStream::kCompute, handle);
    if (u < last) {
      ledger_.release_on(LedgerStream::kCompute, std::exchange(grad_inputs_[u + 1], kNone));
    }
  }
  const Handle grad_input = std::exchange(grad_inputs_[first_running()], kNone);
  awaiting_weight_.emplace_back(micro_batch, take());
  return grad_input;
}

void EngineReplay::backward_weight_micro_batch(int micro_batch, bool reduce_now) {
  load(take_held(awaiting_weight_, micro_batch));
  backward_begins();
  Bucket bucket;
  for (int u = static_cast<int>(units_.size()) - 1; u >= 0; --u) {
    if (units_[u].runs) {
      std::vector<Handle> scratch;
      prepare(u, true, scratch);
      grow_stream_scratch(units_[u].memory.backward_stream_scratch);
      scratch.push_back(std::exchange(split_[u], kNone));
      release_saved(u, scratch);
      for (Handle handle : scratch) ledger_.release_on(LedgerStream::kCompute, handle);
      ledger_.release_on(LedgerStream::kCompute, std::exchange(outputs_[u], kNone));
    }
    unit_done(u, reduce_now, bucket);
  }
  take();
}

}  // namespace zest
