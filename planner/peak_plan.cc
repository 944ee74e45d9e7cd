#include "planner/peak_plan.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "base/error.h"
#include "kernels/gradient_statistics.h"
#include "memory/shard_layout.h"
#include "engine/flat_unit.h"
#include "engine/gather_ring.h"
#include "engine/quantized_collectives.h"
#include "engine/gradient_reducer.h"
#include "engine/parameter_gatherer.h"
#include "engine/recompute.h"
#include "engine/secondary_partition.h"
#include "engine/stage_plan.h"
#include "planner/peak_ledger.h"

namespace zest {
namespace {

using Handle = PeakLedger::Handle;
using Stream = PeakLedger::Stream;
constexpr Handle kNone = PeakLedger::kNone;

struct PlannedUnit {
  std::size_t full = 0;   // flat length, padded
  std::size_t shard = 0;
  std::vector<int> borrowed;
  UnitMemory memory;
  bool replaces_parameters = false;  // Unit::gradients_replace_parameters()
  bool gradient_in_slot = false;     // stage 3: its gradient lives in its gather slot
  RecomputePolicy recompute = RecomputePolicy::kNone;
  bool input_offloaded = false;  // cpu_checkpointing: its input waits on the host
  bool borrows_in_turn = false;  // Unit::borrows_in_turn()
  bool backward_reads_parameters = true;  // Unit::backward_reads_parameters()
};

// Replays the allocations and frees of ZeroTrainer and its collaborators (gradient reducer,
// parameter gatherer, gradient checks), call by call, in the order the host makes them.
class Replay {
 public:
  explicit Replay(const PeakPlanInput& input);
  void construct();
  void micro_batch(bool last);
  void step();
  PeakPrediction result() const;

 private:
  bool two_byte() const { return options_.compute_dtype != DType::kFloat32; }
  std::size_t element() const { return dtype_size(options_.compute_dtype); }
  // The quantized collectives' buffers are sized by it (engine/quantized_collectives.h).
  std::size_t largest_shard() const {
    std::size_t largest = 0;
    for (const PlannedUnit& unit : units_) largest = std::max(largest, unit.shard);
    return largest;
  }
  // ZeroTrainer::prepare_call: fp32 copies of 2-byte parameters, gradient buckets
  // (GradientReducer::target), fp32 gradient accumulators, for the unit and the units it borrows.
  void prepare(int u, bool backward, std::vector<Handle>& scratch);
  void gradient_target(int u);
  std::vector<int> call_members(int u) const;
  void borrow_in_turn(int u, bool backward);
  void forward();
  void backward(bool reduce_now);
  void reduce(int u);

  bool on_cuda() const { return input_.device == DeviceKind::kCuda; }
  // CudaStream::workspace: the compute stream's scratch grows to the largest ask (the old one
  // freed first), never shrinks. Nothing on the CPU device.
  void grow_stream_scratch(std::size_t bytes);
  // ZeroTrainer::wait_for_lagging_call / recomputed_call_done (engine/recompute.h).
  void wait_for_lagging_call();
  void recomputed_call_done();

  const PeakPlanInput& input_;
  const EngineOptions& options_;
  const StagePlan plan_;
  // GradientReducer's accumulates_into_shard: no buckets, backward writes the gradient shard.
  const bool into_shard_;
  PeakLedger ledger_;
  Handle stream_scratch_ = PeakLedger::kNone;
  std::size_t stream_scratch_bytes_ = 0;
  std::vector<PlannedUnit> units_;
  std::vector<Handle> outputs_, grad_inputs_, saved_, buckets_;
  std::vector<std::vector<Handle>> held_saved_;  // per unit: others' saved its backward frees
  std::vector<std::size_t> bucket_released_;
  std::vector<bool> targeted_;  // into_shard_: per unit, its shard is this micro-batch's target
  std::size_t forward_done_ = 0;  // into_shard_: compute's position at backward's start
  // into_shard_: GradientReducer::forward_call_begins / done
  std::array<std::size_t, kForwardCallsAhead> forward_calls_{};
  std::size_t forward_calls_begun_ = 0;
  bool forward_pending_ = false;
  std::deque<int> buckets_in_flight_;
  std::size_t recomputed_calls_ = 0;  // in this micro-batch
  std::array<std::size_t, kRecomputeLag> lag_positions_{};
  // CheckpointOffload: the copies to the host still running (copy-stream positions), the
  // fetched outputs' copy positions, and the host buffers' bytes.
  std::deque<std::size_t> copies_in_flight_;
  std::vector<std::size_t> fetched_;
  std::size_t checkpoint_host_bytes_ = 0;
};

Replay::Replay(const PeakPlanInput& input)
    : input_(input), options_(input.engine), plan_(StagePlan::of(input.engine.stage)),
      into_shard_(accumulates_into_shard(plan_, options_, input.world_size, input.replicas)),
      ledger_(input.device == DeviceKind::kCuda) {
  for (std::size_t u = 0; u < input.model.units.size(); ++u) {
    const UnitShapes& shapes = input.model.units[u];
    const ShardLayout layout =
        ShardLayout::build(shapes.name, shapes.params, input.world_size, input.model.alignment);
    PlannedUnit unit{layout.flat_length(), layout.shard_length(), shapes.borrowed, {},
                     shapes.gradients_replace_parameters, false, RecomputePolicy::kNone, false};
    unit.borrows_in_turn = shapes.borrows_in_turn;
    unit.backward_reads_parameters = shapes.backward_reads_parameters;
    if (u < input.units.size()) unit.memory = input.units[u];
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
  held_saved_.assign(n, {});
  buckets_.assign(n, kNone);
  bucket_released_.assign(n, 0);
  targeted_.assign(n, false);
}

void Replay::construct() {
  const MemoryPrediction state = predict_model_state(
      input_.model, options_.stage, input_.world_size, options_.offload_optimizer.enabled());
  ledger_.allocate(state.params, Category::kParams);
  ledger_.allocate(state.grads, Category::kGrads);
  ledger_.allocate(state.optimizer, Category::kOptimizer);
  if (input_.model_state_only) return;
  if (plan_.gathers_before_each_use() && gathers_at(input_.world_size)) {
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
      ledger_.allocate(quantized_gather_bytes(largest_shard(), input_.world_size,
                                              options_.quantization_block),
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
    for (std::size_t u = 0; u < units_.size(); ++u) {
      units_[u].gradient_in_slot = units_[u].replaces_parameters &&
                                   layout.alone_in_class(static_cast<int>(u));
    }
  }
  // GradientReducer's constructor: qgZ's buffers, wherever gradients are reduce-scattered.
  if (options_.quantized_gradients && plan_.reduction == GradientReduction::kReduceScatter) {
    for (std::size_t bytes : quantized_reduction_bytes(largest_shard(), input_.world_size,
                                                       options_.quantization_block)) {
      ledger_.allocate(bytes, Category::kBuckets);
    }
  }
  ledger_.allocate(sizeof(float), Category::kWorkspace);  // the loss
  // The gradient checks: a slot per unit and one for the step's norm.
  ledger_.allocate((units_.size() + 1) * sizeof(GradientStatistics), Category::kWorkspace);
}

void Replay::gradient_target(int u) {
  if (!plan_.reduce_per_unit || buckets_[u] != kNone || targeted_[u]) return;
  if (forward_pending_) {  // GradientReducer::wait_for_bucket
    ledger_.synchronize(Stream::kCompute, forward_done_);
    forward_pending_ = false;
  }
  const std::size_t live = into_shard_ ? kLiveShardTargets : kLiveGradientBuckets;
  while (buckets_in_flight_.size() >= live) {
    ledger_.synchronize(Stream::kComm, bucket_released_[buckets_in_flight_.front()]);
    buckets_in_flight_.pop_front();
  }
  if (into_shard_) {  // GradientReducer::target: the wait, no bucket
    targeted_[u] = true;
    return;
  }
  buckets_[u] = ledger_.allocate(units_[u].full * element(), Category::kBuckets);
}

std::vector<int> Replay::call_members(int u) const {
  std::vector<int> members{u};
  // A unit that borrows in turn pins its lenders inside the call (borrow_in_turn below).
  if (units_[u].borrows_in_turn) return members;
  members.insert(members.end(), units_[u].borrowed.begin(), units_[u].borrowed.end());
  return members;
}

void Replay::borrow_in_turn(int u, bool backward) {
  // ZeroTrainer::pin_borrowed / unpin_borrowed: a 2-byte lender's fp32 copy from its pin to its
  // unpin, one lender after another (forward in order, backward in reverse, as the GPT's head).
  if (!units_[u].borrows_in_turn || !two_byte()) return;
  std::vector<int> lenders = units_[u].borrowed;
  if (backward) std::reverse(lenders.begin(), lenders.end());
  for (int lender : lenders) {
    ledger_.release_on(Stream::kCompute, ledger_.allocate(units_[lender].full * sizeof(float),
                                                          Category::kWorkspace));
  }
}

void Replay::prepare(int u, bool backward, std::vector<Handle>& scratch) {
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

void Replay::wait_for_lagging_call() {
  if (!on_cuda() && recomputed_calls_ >= kRecomputeLag) {
    ledger_.synchronize(Stream::kCompute, lag_positions_[recomputed_calls_ % kRecomputeLag]);
  }
  // CheckpointOffload::bound_copies
  while (!copies_in_flight_.empty()) {
    if (!on_cuda()) ledger_.synchronize(Stream::kCopy, copies_in_flight_.front());
    copies_in_flight_.pop_front();
  }
}

void Replay::recomputed_call_done() {
  if (on_cuda()) return;
  lag_positions_[recomputed_calls_ % kRecomputeLag] = ledger_.record(Stream::kCompute);
  ++recomputed_calls_;
}

void Replay::forward() {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const RecomputePolicy recompute = units_[u].recompute;
    if (into_shard_ && forward_calls_begun_ >= kForwardCallsAhead) {
      ledger_.synchronize(Stream::kCompute,
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
    for (Handle handle : scratch) ledger_.release_on(Stream::kCompute, handle);
    if (units_[u].input_offloaded) {
      // CheckpointOffload::offload: the copy waits for compute, the device buffer goes after it.
      ledger_.wait(Stream::kCopy, Stream::kCompute, ledger_.record(Stream::kCompute));
      ledger_.release_on(Stream::kCopy, std::exchange(outputs_[u - 1], kNone));
      copies_in_flight_.push_back(ledger_.record(Stream::kCopy));
    }
    if (recompute != RecomputePolicy::kNone) recomputed_call_done();
    if (into_shard_) {
      forward_calls_[forward_calls_begun_ % kForwardCallsAhead] = ledger_.record(Stream::kCompute);
      ++forward_calls_begun_;
    }
  }
}

void Replay::backward(bool reduce_now) {
  if (into_shard_) {  // GradientReducer::backward_begins
    forward_done_ = ledger_.record(Stream::kCompute);
    forward_pending_ = true;
    forward_calls_begun_ = 0;
  }
  std::vector<int> bucket;
  std::size_t bucket_elements = 0;
  const int last = static_cast<int>(units_.size()) - 1;
  for (int u = last; u >= 0; --u) {
    const RecomputePolicy recompute = units_[u].recompute;
    if (u >= 2 && units_[u - 1].input_offloaded) {  // CheckpointOffload::fetch, a unit ahead
      outputs_[u - 2] = ledger_.allocate(units_[u - 2].memory.output, Category::kActivations);
      fetched_[u - 2] = ledger_.record(Stream::kCopy);
    }
    // ZeroTrainer::prepare_call: the wait comes after the pins (which allocate nothing) and
    // before the call's views.
    if (recompute != RecomputePolicy::kNone) wait_for_lagging_call();
    std::vector<Handle> scratch;
    prepare(u, true, scratch);
    if (units_[u].input_offloaded) ledger_.wait(Stream::kCompute, Stream::kCopy, fetched_[u - 1]);
    const UnitMemory& memory = units_[u].memory;
    if (recompute == RecomputePolicy::kFull) {
      // The forward again, in the same call: its output is written over the first one's.
      saved_[u] = ledger_.allocate(memory.saved, Category::kActivations);
      ledger_.release_on(Stream::kCompute,
                         ledger_.allocate(memory.forward_workspace, Category::kWorkspace));
      grow_stream_scratch(memory.forward_stream_scratch);
    } else if (recompute == RecomputePolicy::kSelective) {
      scratch.push_back(ledger_.allocate(memory.selective_rebuilt, Category::kActivations));
      ledger_.release_on(Stream::kCompute,
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
    const int freed_by = memory.saved_freed_by;
    if (freed_by >= 0 && freed_by != u) {
      held_saved_[static_cast<std::size_t>(freed_by)].push_back(std::exchange(saved_[u], kNone));
    } else {
      scratch.push_back(std::exchange(saved_[u], kNone));
    }
    for (Handle held : held_saved_[static_cast<std::size_t>(u)]) scratch.push_back(held);
    held_saved_[static_cast<std::size_t>(u)].clear();
    for (Handle handle : scratch) ledger_.release_on(Stream::kCompute, handle);
    ledger_.release_on(Stream::kCompute, std::exchange(outputs_[u], kNone));
    if (u < last) ledger_.release_on(Stream::kCompute, std::exchange(grad_inputs_[u + 1], kNone));
    if (recompute != RecomputePolicy::kNone) recomputed_call_done();
    if (!reduce_now) continue;
    bucket.push_back(u);
    bucket_elements += units_[u].full;
    if (plan_.reduce_per_unit || bucket_elements >= options_.reduce_bucket_size || u == 0) {
      for (int member : bucket) reduce(member);
      bucket.clear();
      bucket_elements = 0;
      if (!options_.overlap_comm) {
        ledger_.wait(Stream::kCompute, Stream::kComm, ledger_.record(Stream::kComm));
      }
    }
  }
  ledger_.release_on(Stream::kCompute, std::exchange(grad_inputs_[0], kNone));
}

void Replay::reduce(int u) {
  ledger_.wait(Stream::kComm, Stream::kCompute, ledger_.record(Stream::kCompute));
  if (options_.communication_dtype != options_.compute_dtype) {
    const std::size_t bytes = units_[u].full * dtype_size(options_.communication_dtype);
    ledger_.release_on(Stream::kComm, ledger_.allocate(bytes, Category::kBuckets));
  }
  if (plan_.reduce_per_unit && into_shard_) {
    targeted_[u] = false;
    bucket_released_[u] = ledger_.record(Stream::kComm);
    buckets_in_flight_.push_back(u);
  } else if (plan_.reduce_per_unit && !units_[u].gradient_in_slot) {
    ledger_.release_on(Stream::kComm, std::exchange(buckets_[u], kNone));
    bucket_released_[u] = ledger_.record(Stream::kComm);
    buckets_in_flight_.push_back(u);
  }
}

void Replay::grow_stream_scratch(std::size_t bytes) {
  if (!on_cuda() || bytes <= stream_scratch_bytes_) return;
  ledger_.release_on(Stream::kCompute, std::exchange(stream_scratch_, kNone));
  stream_scratch_ = ledger_.allocate(bytes, Category::kWorkspace);
  stream_scratch_bytes_ = bytes;
}

void Replay::micro_batch(bool last) {
  // engine/device_batch.h: a CUDA device copies the batch in first and frees it after backward.
  const Handle batch =
      on_cuda() ? ledger_.allocate(input_.batch_bytes, Category::kActivations) : kNone;
  recomputed_calls_ = 0;
  forward();
  backward(plan_.reduce_every_micro_batch || last);
  ledger_.release_on(Stream::kCompute, batch);
  ledger_.synchronize(Stream::kCompute);  // forward_backward reads the loss
}

void Replay::step() {
  ledger_.synchronize(Stream::kComm);
  if (!options_.offload_optimizer.enabled() && two_byte()) {
    // ZeroTrainer::update_unit: each unit's 2-byte gradients widened to fp32 for the optimizer.
    for (const PlannedUnit& unit : units_) {
      const std::size_t length = plan_.optimizer_length(unit.full, unit.shard);
      ledger_.release_on(Stream::kCompute,
                         ledger_.allocate(length * sizeof(float), Category::kWorkspace));
    }
  }
  // ParameterGatherer::step_done: comm waits for the optimizer.
  ledger_.wait(Stream::kComm, Stream::kCompute, ledger_.record(Stream::kCompute));
  if (input_.synchronize_between_steps) ledger_.synchronize(Stream::kComm);
}

PeakPrediction Replay::result() const {
  PeakPrediction prediction;
  for (Category category : all_categories()) {
    prediction.peak[static_cast<std::size_t>(category)] = ledger_.peak_of(category);
  }
  prediction.device_total = ledger_.total_peak();
  prediction.model_state = predict_model_state(input_.model, options_.stage, input_.world_size,
                                               options_.offload_optimizer.enabled());
  prediction.peak[static_cast<std::size_t>(Category::kOffload)] =
      prediction.model_state.offload + checkpoint_host_bytes_;
  return prediction;
}

}  // namespace

PeakPrediction predict_peak(const PeakPlanInput& input) {
  const EngineOptions& options = input.engine;
  const StagePlan plan = StagePlan::of(options.stage);
  if (options.offload_optimizer.enabled() && !plan.can_offload_optimizer()) {
    throw Error(ErrorKind::kConfig,
                "zero_optimization.offload_optimizer.device: \"cpu\" needs "
                "zero_optimization.stage 1, 2 or 3 (got 0)");
  }
  if (input.world_size < 1) {
    throw Error(ErrorKind::kConfig, "world.ranks: must be >= 1, got " +
                                        std::to_string(input.world_size));
  }
  Replay replay(input);
  replay.construct();
  if (input.model_state_only) return replay.result();
  // Two steps: the second starts while the first's optimizer scratch may still be queued.
  for (int step = 0; step < 2; ++step) {
    const int micro_batches = std::max(options.gradient_accumulation_steps, 1);
    for (int micro = 0; micro < micro_batches; ++micro) {
      replay.micro_batch(micro + 1 == micro_batches);
    }
    replay.step();
  }
  return replay.result();
}

PeakPlanInput plan_input(Module& module, const std::vector<std::int64_t>& input_shape,
                         const EngineOptions& engine, std::size_t optimizer_states,
                         int world_size) {
  PeakPlanInput input;
  input.model = describe_model_state(module, engine.compute_dtype, optimizer_states,
                                     engine.shard_alignment);
  input.units = module.unit_memory(input_shape);
  input.engine = engine;
  input.world_size = world_size;
  return input;
}

}  // namespace zest
