// The Trainer of the ZeRO engine: the schedule of a step at the configured stage. It owns the
// units' flat buffers and the activations, runs each unit's forward and backward between the
// hooks of its collaborators, and runs the sharded optimizer step; each collaborator owns one
// concept and says its invariant in its header:
//   ParameterGatherer (engine/parameter_gatherer.h): full parameters before compute, the gather
//     ring at stage 3, the gathers after the step at stages 1-2;
//   GradientReducer (engine/gradient_reducer.h): buckets, all-reduce / reduce-scatter;
//   HostOptimizer (engine/host_optimizer.h): offload_optimizer's host stream and host shards;
//   GradientChecks (engine/gradient_checks.h): non-finite gradients, the local norm, divergence;
//   BorrowedUnits (engine/borrowed_units.h): the units a call borrows, pinned at once or in turn.
// Where the code is: zero_trainer.cc (construction, forward, backward), zero_trainer_step.cc
// (step(): the loss and norm, loss scaling, clipping, the optimizer), zero_trainer_state.cc
// (checkpoint views and counters), zero_trainer_faults.cc (debug faults), zero_trainer_memory.cc
// (out-of-memory advice), zero_trainer_hooks.cc (one unit's forward or backward in a pass: the
// hooks a caller that drives micro-batches itself uses, pipeline/stage_runner.h).
// Built by Engine::shard(); see engine/engine.h for the contract.
#pragma once

#include <memory>
#include <vector>

#include "engine/borrowed_units.h"
#include "engine/checkpoint_offload.h"
#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "engine/gradient_checks.h"
#include "engine/gradient_reducer.h"
#include "engine/host_optimizer.h"
#include "engine/micro_batch_pass.h"
#include "engine/model_state.h"
#include "engine/parameter_gatherer.h"
#include "engine/stage_plan.h"
#include "engine/swapped_parameters.h"
#include "optim/loss_scaler.h"

namespace zest {

class ZeroTrainer final : public Trainer {
 public:
  ZeroTrainer(RankContext& context, const EngineOptions& options, Module& module,
              std::unique_ptr<Optimizer> optimizer);
  ~ZeroTrainer() override;

  float forward_backward(const Batch& batch) override;
  StepStats step(float lr) override;  // zero_trainer_step.cc
  float evaluate(const Batch& batch) override;
  std::vector<float> full_parameter(const std::string& name) override;
  std::vector<std::string> parameter_names() const override;
  const std::vector<ShardLayout>& layouts() const override { return layouts_; }
  MemoryPrediction predicted_memory() const override;
  // The units' parameter shapes, for engine/model_state.h.
  ModelStateShape model_state_shape() const;
  int stage() const override { return plan_.stage; }
  std::int64_t steps_taken() const override { return steps_taken_; }
  const EngineOptions& options() const override { return options_; }
  std::vector<StateShard> state_shards(std::size_t unit) override;
  void state_loaded() override;
  void hold_state_for(std::shared_ptr<Event> readers) override;
  TrainerCounters counters() const override;
  void set_counters(const TrainerCounters& counters) override;
  // Hybrid sharding's: the shard group's shard, one of `replicas` copies; none otherwise.
  std::optional<CheckpointPlacement> checkpoint_placement() const override;
  std::size_t swap_bytes() const override;
  SwapTraffic swap_traffic() const override;

  // For tests: how many units the gather ring holds now (stage 3; 0 otherwise).
  std::size_t gathered_units() const { return gatherer_->gathered_units(); }
  // For tests: hpZ's secondary shard (null when zero_hpz_partition_size is off).
  const SecondaryShard* secondary_shard() const { return gatherer_->secondary(); }

  // ---- hooks for a caller that drives micro-batches itself ----
  // A pipeline stage's runner (pipeline/stage_runner.h) keeps several micro-batches in flight
  // and runs their forwards and backwards in a schedule's order; forward_backward() and
  // evaluate() are the same hooks driven in the plain order. Every rank of the trainer's group
  // calls them in the same order (the reductions are collectives).
  //
  // A pass over `units`: the module's units or a replica of them (same names and parameters, in
  // the same order; a kUsage Error otherwise). `evaluating`: forward only, nothing kept for a
  // backward and nothing recomputed.
  MicroBatchPass make_pass(const std::vector<Unit*>& units, bool evaluating = false) const;
  // Unit `u`'s forward in `pass`: the first computing unit reads `batch.inputs`, every other the
  // previous unit's output; the loss unit reads `batch.targets` and writes loss_buffer(). A lent
  // copy runs nothing. `batch` stays valid until the pass's backward has been enqueued.
  void forward_unit(std::size_t u, const Batch& batch, MicroBatchPass& pass);
  // Before a pass's backward (whole, or its weight half): whether it is the step's last
  // micro-batch, whose backward reduces the accumulated gradients (stages 0-1; stages 2-3
  // reduce every micro-batch's as its units' backwards end, as the stage plan says).
  void begin_backward(bool last_micro_batch);
  // Unit `u`'s backward in `pass`, units in reverse order. kWhole: gradients of the input and the
  // parameters, the unit's output and received gradient released, its gradients handed to the
  // reducer. Split backward (the zero-bubble schedules' B and W; only where splits_backward()):
  // kInput makes the input gradient alone (no parameter gradient, nothing reduced, the outputs
  // kept), kWeight then adds the parameter gradients and counts as the unit's backward.
  enum class BackwardPart { kWhole, kInput, kWeight };
  void backward_unit(std::size_t u, const Batch& batch, MicroBatchPass& pass,
                     BackwardPart part = BackwardPart::kWhole);
  // Whether every unit that computes offers split backward (Unit::supports_split_backward) and
  // none recomputes.
  bool splits_backward() const;
  // Releases, in compute-stream order, every buffer `pass` still holds.
  void release_pass(MicroBatchPass& pass);
  // The device float the loss unit writes each forward's loss to (overwritten by the next).
  const float* loss_buffer() const { return loss_buffer_.as<float>(); }
  // What this rank adds to the step's one all-reduce: `loss` (its share of the step's mean
  // loss), the squared gradient norm (lent copies left out), the overflow flag. Waits for the
  // reductions.
  struct StepTotals {
    float values[3] = {0.0f, 0.0f, 0.0f};
  };
  StepTotals step_totals(double loss);
  // The step, once every rank's totals are summed (what step() does after its all-reduce).
  StepStats finish_step(float lr, const StepTotals& summed);
  // Whether `summed` stops the run: a non-finite gradient, and no loss scale to lower. Then
  // finish_step() raises it over this trainer's groups, and a caller that summed the totals over
  // more ranks (a pipeline) raises it over its own first, with non_finite_finding().
  bool diverges(const StepTotals& summed) const;
  NonFiniteFinding non_finite_finding() const { return checks_->finding(units_); }
  // After the step's last backward, before step_totals(): unit `unit`'s reduced gradient, what
  // this rank's optimizer reads (the whole buffer at stage 0, this rank's shard at stages 1-3),
  // in the compute dtype, for a caller that sums it with a copy's on the comm stream (a unit
  // tied across pipeline stages); then reduced_gradient_changed(unit).
  Tensor reduced_gradient(std::size_t unit);
  // After the caller's sum of reduced_gradient(unit) was enqueued on the comm stream: the
  // offloaded optimizer, which took the unit's shard to the host at its last reduction, takes
  // the sum there again (in comm-stream order, before the update waits for it).
  void reduced_gradient_changed(std::size_t unit);

 private:
  class Context;
  // Which forward a Context runs: a plain one, the first of a fully recomputed unit (it keeps
  // nothing), or the recomputation before its backward (its output exists already).
  enum class CallKind { kPlain, kCheckpoint, kRecompute };
  // The fp32 views one unit call works on, and what must happen after it.
  struct CallViews {
    bool backward = false;
    bool own_pinned = true;  // false: a backward that reads no parameter (not gathered)
    float* params = nullptr;
    float* grads = nullptr;  // null until asked for where the gradient lives in its gather slot
    struct Fold {  // fp32 gradients to add into a 2-byte gradient buffer after the call
      void* target;
      const float* source;
      std::size_t count;
    };
    std::vector<Fold> folds;
    std::vector<Buffer> scratch;  // fp32 copies, freed in stream order after the call
    BorrowedUnits::Call borrowed;  // the units the call borrows (engine/borrowed_units.h)
    // Where the scratch copies are written: the destructor frees what finish_call did not in
    // that stream's order. Note: a failure in the call (an out-of-memory) unwinds the views
    // while the stream may still be widening parameters into them, and on the CPU device a
    // Buffer frees at once: freed plainly, the stream would write into the heap's free lists.
    Device* device = nullptr;
    Stream* stream = nullptr;

    CallViews() = default;
    CallViews(CallViews&&) = default;
    CallViews& operator=(CallViews&&) = delete;
    ~CallViews();
  };

  // For an out-of-memory in a micro-batch: the planner's estimate at this micro-batch and the
  // smallest change that fits (zero_trainer_memory.cc).
  std::string training_memory_advice(const Batch& batch) const;
  void allocate_state();
  // allocate_state(), with an out-of-memory that says what the model state needs and what fits.
  void allocate_model_state();
  void initialize_parameters();
  // The fp32 master shard's first values (the draw, from the shard's first element), wherever
  // the master lives: the device, the host shards, or the NVMe tier.
  void initialize_master(FlatUnit& unit, const float* values);
  std::size_t element_size() const { return dtype_size(options_.compute_dtype); }
  bool offloaded() const { return host_ != nullptr; }
  float* fp32_params(void* params, std::size_t count, CallViews& views);
  float* fp32_grads(void* target, std::size_t count, CallViews& views);
  // The fp32 view of `unit`'s gradient target for this call (GradientReducer::target).
  float* gradient_view(FlatUnit& unit, CallViews& views);
  // Pins the unit (and the units it borrows at once), then, for a recomputed unit, waits for the
  // lagging call, then allocates the call's views.
  CallViews prepare_call(FlatUnit& unit, const MicroBatchPass& pass, bool backward,
                         bool recomputed = false);
  void finish_call(FlatUnit& unit, CallViews& views);
  // Runs `method` of the pass's unit with a Context over `views`, traced as `slice`.
  void call_unit(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass, CallViews& views,
                 void (Unit::*method)(UnitContext&), const std::string& slice,
                 CallKind kind = CallKind::kPlain);
  // Whether the call pins the unit itself: a backward that reads no parameter
  // (Unit::backward_reads_parameters) needs no gather, unless it is recomputed first or its
  // gradient lives in its gather slot.
  bool pins_own(const FlatUnit& unit, bool backward, bool recomputed) const;
  // The whole forward and backward of `pass` in the plain order.
  void run_forward(const Batch& batch, MicroBatchPass& pass);
  void run_backward(const Batch& batch, MicroBatchPass& pass, bool last_micro_batch);
  // Whether unit `u` recomputes in `pass` (never while evaluating).
  RecomputePolicy recompute_of(std::size_t u, const MicroBatchPass& pass) const {
    return pass.evaluating_ ? RecomputePolicy::kNone : recompute_[u];
  }
  // Around each call of a recomputed unit: the host waits for the stream to finish the
  // recomputed call kRecomputeLag calls back in the pass (CPU device only; engine/recompute.h).
  void wait_for_lagging_call(const MicroBatchPass& pass);
  void recomputed_call_done(MicroBatchPass& pass);
  // backward_unit's parts.
  void backward_whole(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass);
  void backward_input(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass);
  void backward_weight(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass);
  // Debug faults (engine/fault_injection.h) due at the start of this step / after a unit's
  // backward.
  void inject_step_fault();
  void inject_gradient_fault(FlatUnit& unit);
  void release_on(Stream& stream, Buffer buffer);
  // Timeline (when the world records a trace): the compute work enqueued between the two calls
  // becomes one slice.
  std::shared_ptr<std::int64_t> trace_begin();
  void trace_end(const std::shared_ptr<std::int64_t>& begin, std::string name);

  // Waits for hold_state_for's readers (a failed copy is its reader's to report).
  void wait_for_state_readers();

  // zero_trainer_step.cc
  void apply_optimizer(float lr, float grad_scale);
  void update_unit(FlatUnit& unit, const UpdateArgs& args);
  void zero_gradients();

  RankContext& context_;
  const Module& module_;  // outlives the trainer (Engine::shard's contract)
  EngineOptions options_;
  StagePlan plan_;  // from options_.stage
  std::unique_ptr<Optimizer> optimizer_;
  LossScaler scaler_;
  std::vector<FlatUnit> units_;
  std::vector<ShardLayout> layouts_;
  MicroBatchPass pass_;  // forward_backward's and evaluate's, on the module's own units
  std::vector<RecomputePolicy> recompute_;  // per unit
  bool bound_recompute_lag_ = false;        // the device frees only when the stream gets there
  std::vector<std::unique_ptr<Event>> lag_events_;  // kRecomputeLag, reused in turn
  // cpu_checkpointing only: per unit, whether its input (the previous unit's output) waits on the
  // host from its forward to its backward, and the copies that move it.
  std::vector<bool> input_offloaded_;
  std::unique_ptr<CheckpointOffload> checkpoints_;
  // offload_param "nvme": the parameter shards on NVMe. Before the gatherer, whose ring fetches
  // through it, so it goes after the ring.
  std::unique_ptr<SwappedParameters> swapped_params_;
  Buffer loss_buffer_;  // one float the last unit writes the micro-batch loss to
  std::unique_ptr<GradientChecks> checks_;
  std::unique_ptr<ParameterGatherer> gatherer_;
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<BorrowedUnits> borrowed_;
  std::size_t first_computing_ = 0;  // lent copies come first
  std::vector<bool> counted_;  // per unit: computes and adds to the gradient norm (not a lent copy)
  int micro_batches_ = 0;  // since the last step
  double loss_sum_ = 0.0;  // this rank's micro-batch losses since the last step
  std::int64_t steps_taken_ = 0;      // step() calls, skipped ones included
  std::int64_t optimizer_steps_ = 0;  // updates applied (Adam's bias correction counts these)
  std::shared_ptr<Event> state_readers_;  // hold_state_for's, until the state next changes
  // offload_optimizer only. The last member: its host stream is drained first.
  std::unique_ptr<HostOptimizer> host_;
};

}  // namespace zest
