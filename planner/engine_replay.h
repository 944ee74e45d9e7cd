// The memory planner's replay of one ZeroTrainer (engine/zero_trainer*.cc and the classes it
// drives: gradient reducer, parameter gatherer, gradient checks), call by call, in the order the
// host makes them, against a PeakLedger (planner/peak_ledger.h). predict_peak drives it a whole
// micro-batch at a time; a pipeline stage's plan (planner/pipeline_plan.h) drives one per model
// chunk through the schedule's actions, micro-batch by micro-batch, on one ledger.
// Invariant: every allocation and release the engine makes, in its order, with its category.
#pragma once

#include <array>
#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

#include "engine/flat_unit.h"
#include "engine/job_shape.h"
#include "engine/recompute.h"
#include "engine/stage_plan.h"
#include "planner/peak_ledger.h"
#include "planner/peak_plan.h"

namespace zest {

class EngineReplay {
 public:
  using Handle = PeakLedger::Handle;
  // CudaStream::workspace: the compute stream's scratch, grown to the largest ask (the old one
  // freed first), never shrunk; one per stream, so trainers that share a stream share it.
  struct StreamScratch {
    Handle handle = PeakLedger::kNone;
    std::size_t bytes = 0;
  };

  // Units [0, copies) of `input` are lent copies (Module::holds_copy): held, reduced and
  // updated, never run. `shared`: the compute stream's scratch when another replay on `ledger`
  // uses the same stream (a pipeline stage's chunks), else the replay's own. `input`, `ledger`
  // and `shared` must outlive the replay.
  EngineReplay(const PeakPlanInput& input, PeakLedger& ledger, std::size_t copies = 0,
               StreamScratch* shared = nullptr);
  // The trainer's construction: model state, the gather ring, the loss and the checks.
  void construct();
  // forward_backward of one micro-batch (ZeroTrainer::forward_backward).
  void micro_batch(bool last);
  void step();
  PeakPrediction result() const;

  // The pipeline-stage calls (pipeline/stage_runner.cc). The backward calls return the
  // gradient of the chunk's input, which the caller owns (kNone when there is none).
  void forward_micro_batch(int micro_batch);
  Handle backward_micro_batch(int micro_batch, bool reduce_now);
  Handle backward_input_micro_batch(int micro_batch);
  void backward_weight_micro_batch(int micro_batch, bool reduce_now);
  // ZeroTrainer::splits_backward: every unit run here splits its backward and none recomputes.
  bool splits_backward() const;
  bool reduces_every_micro_batch() const { return plan_.reduce_every_micro_batch; }
  bool on_cuda() const { return input_.device == DeviceKind::kCuda; }

 private:
  struct PlannedUnit {
    std::size_t full = 0;  // flat length, padded
    std::size_t shard = 0;
    std::vector<int> borrowed;
    UnitMemory memory;
    bool replaces_parameters = false;  // Unit::gradients_replace_parameters()
    bool gradient_in_slot = false;     // stage 3: its gradient lives in its gather slot
    RecomputePolicy recompute = RecomputePolicy::kNone;
    bool input_offloaded = false;  // cpu_checkpointing: its input waits on the host
    bool borrows_in_turn = false;  // Unit::borrows_in_turn()
    bool backward_reads_parameters = true;  // Unit::backward_reads_parameters()
    bool runs = true;  // false: a lent copy
  };
  // What one micro-batch holds between its calls (the engine's activations_ and the units').
  struct Held {
    std::vector<Handle> outputs, grad_inputs, saved, split;
    std::vector<std::vector<Handle>> saved_by;  // per unit: others' saved its backward frees
  };
  // The gradients of a backward waiting to be reduced together (GradientReducer's bucket).
  struct Bucket {
    std::vector<int> units;
    std::size_t elements = 0;
  };

  bool two_byte() const { return options_.compute_dtype != DType::kFloat32; }
  std::size_t element() const { return dtype_size(options_.compute_dtype); }
  // The quantized collectives' buffers are sized by it (engine/quantized_collectives.h).
  std::size_t largest_shard() const;
  // GradientReducer::backward_begins: with gradients accumulated into their shard, the first
  // target waits for the forward.
  void backward_begins();
  // ZeroTrainer::prepare_call: fp32 copies of 2-byte parameters, gradient buckets
  // (GradientReducer::target), fp32 gradient accumulators, for the unit and the units it borrows.
  void prepare(int u, bool backward, std::vector<Handle>& scratch);
  void gradient_target(int u);
  std::vector<int> call_members(int u) const;
  void borrow_in_turn(int u, bool backward);
  void forward();
  void backward(bool reduce_now);
  // The unit's saved activations, released by its own backward or held for the unit that frees
  // them (UnitMemory::saved_freed_by), and what it held for others.
  void release_saved(int u, std::vector<Handle>& scratch);
  // GradientReducer::unit_done.
  void unit_done(int u, bool reduce_now, Bucket& bucket);
  void reduce(int u);
  int first_running() const;
  void load(Held held);
  Held take();

  // StreamScratch on the CUDA device; nothing on the CPU device.
  void grow_stream_scratch(std::size_t bytes);
  // ZeroTrainer::wait_for_lagging_call / recomputed_call_done (engine/recompute.h).
  void wait_for_lagging_call();
  void recomputed_call_done();

  const PeakPlanInput& input_;
  const EngineOptions& options_;
  const StagePlan plan_;
  // GradientReducer's accumulates_into_shard: no buckets, backward writes the gradient shard.
  const bool into_shard_;
  PeakLedger& ledger_;
  StreamScratch own_scratch_;
  StreamScratch& stream_scratch_;
  std::vector<PlannedUnit> units_;
  std::vector<Handle> outputs_, grad_inputs_, saved_, split_, buckets_;
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
  // The pipeline-stage calls: micro-batches between forward and backward, and between
  // backward-input and backward-weight; the step's micro-batch losses (workspace).
  std::vector<std::pair<int, Held>> in_flight_, awaiting_weight_;
  bool loss_slots_ = false;
};

}  // namespace zest
