// The Trainer of the ZeRO engine: the schedule of a step at the configured stage. It owns the
// units' flat buffers and the activations, runs each unit's forward and backward between the
// hooks of its collaborators, and runs the sharded optimizer step; each collaborator owns one
// concept and says its invariant in its header:
//   ParameterGatherer (engine/parameter_gatherer.h): full parameters before compute, the gather
//     ring at stage 3, the gathers after the step at stages 1-2;
//   GradientReducer (engine/gradient_reducer.h): buckets, all-reduce / reduce-scatter;
//   HostOptimizer (engine/host_optimizer.h): offload_optimizer's host stream and host shards;
//   GradientChecks (engine/gradient_checks.h): non-finite gradients, the local norm, divergence.
// Where the code is: zero_trainer.cc (construction, forward, backward), zero_trainer_step.cc
// (step(): the loss and norm, loss scaling, clipping, the optimizer), zero_trainer_state.cc
// (checkpoint views and counters), zero_trainer_faults.cc (debug faults), zero_trainer_memory.cc
// (out-of-memory advice), zero_trainer_pipeline.cc (one pipeline stage's micro-batch calls).
// Built by Engine::shard(); see engine/engine.h for the contract.
#pragma once

#include <memory>
#include <vector>

#include "engine/checkpoint_offload.h"
#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "engine/gradient_checks.h"
#include "engine/gradient_reducer.h"
#include "engine/host_optimizer.h"
#include "engine/model_state.h"
#include "engine/parameter_gatherer.h"
#include "engine/stage_plan.h"
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
  TrainerCounters counters() const override;
  void set_counters(const TrainerCounters& counters) override;
  // Hybrid sharding's: the shard group's shard, one of `replicas` copies; none otherwise.
  std::optional<CheckpointPlacement> checkpoint_placement() const override;
  std::size_t swap_bytes() const override;

  // For tests: how many units the gather ring holds now (stage 3; 0 otherwise).
  std::size_t gathered_units() const { return gatherer_->gathered_units(); }
  // For tests: hpZ's secondary partition (null when zero_hpz_partition_size is off).
  const SecondaryPartition* secondary_partition() const { return gatherer_->secondary(); }

  // ---- a pipeline stage (zero_trainer_pipeline.cc; pipeline/pipeline_trainer.h drives it) ----
  // Built on the stage's units (engine/sub_module.h) in the stage's data-parallel group, with
  // gradient_accumulation_steps = the step's micro-batches. Several micro-batches are in flight
  // at once: each keeps its units' outputs here until its backward, and runs on its own Unit
  // objects (use_units), since units keep what their backward reads in themselves.
  //
  // The Unit objects the next calls run: a replica of the module's units, same names and
  // parameters, in the same order.
  void use_units(const std::vector<Unit*>& units);
  // Forward of micro-batch `micro_batch` (0-based in the step): the stage's first unit reads
  // `batch.inputs` (received activations, or the tokens on the first stage); the loss unit reads
  // `batch.targets`. Returns the stage's output, valid until this micro-batch's backward has been
  // enqueued (empty when the stage ends in the loss, which is kept for step_totals()). `batch`
  // must stay valid until the backward.
  Tensor forward_micro_batch(int micro_batch, const Batch& batch);
  // Backward of `micro_batch` from `grad_output`, the gradient of the stage's output (empty on
  // the loss stage). Returns the gradient of the stage's input and the buffer that owns it
  // (empty on the first stage, whose input is tokens): free it in stream order after its send.
  // The step's last backward reduces as the stage plan says.
  Tensor backward_micro_batch(int micro_batch, const Batch& batch, const Tensor& grad_output,
                              Buffer& grad_input_owner);
  // Forward only, between steps (a pipeline's evaluation): the stage's output and the buffer
  // that owns it (empty on the loss stage); nothing is kept for a backward.
  Tensor evaluate_micro_batch(const Batch& batch, Buffer& output_owner);
  // The loss the last evaluate_micro_batch wrote on the loss stage (waits for compute).
  float evaluation_loss();
  // Split backward (the zero-bubble schedules' B and W): whether every unit that computes offers
  // it (Unit::supports_split_backward) and none recomputes; else the pipeline runs
  // backward_micro_batch where B is scheduled and nothing at W. backward_input_micro_batch is
  // backward_micro_batch's input-gradient half: no parameter gradient is touched, nothing is
  // reduced, and the micro-batch's outputs stay for backward_weight_micro_batch, which adds the
  // parameter gradients and counts as the micro-batch's backward (the step's last one reduces).
  // `batch` stays valid until then.
  bool splits_backward() const;
  Tensor backward_input_micro_batch(int micro_batch, const Batch& batch, const Tensor& grad_output,
                                    Buffer& grad_input_owner);
  void backward_weight_micro_batch(int micro_batch, const Batch& batch);
  // What this rank adds to the step's all-reduce (zero_trainer_step.cc): the loss over the
  // world's ranks (the pipeline's loss stage only), the squared gradient norm (lent copies left
  // out), the overflow flag. Waits for the reductions.
  struct StepTotals {
    float values[3] = {0.0f, 0.0f, 0.0f};
  };
  StepTotals step_totals(int loss_ranks);
  // The step, once every rank's totals are summed (what step() does after its all-reduce).
  StepStats finish_step(float lr, const StepTotals& summed);
  // After the step's last backward, before step_totals(): sums unit `unit`'s reduced gradient —
  // what this rank's optimizer reads: the whole buffer at stage 0, this rank's shard at stages
  // 1-3 — over `group`, on the comm stream after the reductions. For a unit tied across two
  // pipeline stages: both hold it in data-parallel groups of one size with one layout, so shard
  // d on one stage is shard d on the other, and the sum of the reduced shards is the reduction
  // of the summed gradients.
  void sum_reduced_gradient(std::size_t unit, Communicator& group, const std::string& label);

 private:
  class Context;
  // Which forward a Context runs: a plain one, the first of a fully recomputed unit (it keeps
  // nothing), or the recomputation before its backward (its output exists already).
  enum class Pass { kPlain, kCheckpoint, kRecompute };
  struct Activations {
    Buffer output;      // this unit's forward output
    Buffer grad_input;  // the gradient of this unit's input, made in backward
    Tensor output_view;
    Tensor grad_input_view;
  };
  // The fp32 views one unit call works on, and what must happen after it.
  struct CallViews {
    bool backward = false;
    bool own_pinned = true;  // false: a backward that reads no parameter (not gathered)
    float* params = nullptr;
    float* grads = nullptr;  // null until asked for where the gradient lives in its gather slot
    std::vector<float*> borrowed_params;
    std::vector<float*> borrowed_grads;
    struct Fold {  // fp32 gradients to add into a 2-byte gradient buffer after the call
      void* target;
      const float* source;
      std::size_t count;
    };
    std::vector<Fold> folds;
    std::vector<Buffer> scratch;  // fp32 copies, freed in stream order after the call
    // Per borrowed unit: pinned now (a unit that borrows in turn pins and unpins them in the
    // call), and its fp32 copy in 2-byte training, freed at its unpin.
    std::vector<bool> borrowed_pinned;
    std::vector<Buffer> borrowed_copies;
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
  // Pins the unit (and the units it borrows), then, for a recomputed unit, waits for the lagging
  // call, then allocates the call's views.
  CallViews prepare_call(FlatUnit& unit, bool backward, bool recomputed = false);
  void finish_call(FlatUnit& unit, CallViews& views);
  // Runs `method` of the unit with a plain Context over `views`, traced as `slice` (the split
  // backward's calls, zero_trainer_pipeline.cc).
  void call_unit(FlatUnit& unit, const Batch& batch, CallViews& views,
                 void (Unit::*method)(UnitContext&), const std::string& slice);
  // Unit::borrows_in_turn: pins borrowed unit `b` at the unit's first ask (its fp32 copy made in
  // 2-byte training) and unpins it when the unit hands it back. No-ops otherwise.
  void pin_borrowed(FlatUnit& unit, CallViews& views, std::size_t b);
  void unpin_borrowed(FlatUnit& unit, CallViews& views, std::size_t b);
  // prepare_call's and finish_call's parts of it (zero_trainer_borrow.cc): whether the call pins
  // the unit itself; a unit that borrows in turn gets empty borrowed views (true); the borrowed
  // units still pinned at the end of the call are unpinned.
  bool pins_own(const FlatUnit& unit, bool backward, bool recomputed) const;
  bool defer_borrowed(FlatUnit& unit, CallViews& views);
  void unpin_borrowed_units(FlatUnit& unit, CallViews& views);
  void run_forward(const Batch& batch);
  void run_backward(const Batch& batch, bool last_micro_batch);
  // Whether unit `u` recomputes in this pass (never while evaluating).
  RecomputePolicy recompute_of(std::size_t u) const {
    return evaluating_ ? RecomputePolicy::kNone : recompute_[u];
  }
  // Around each call of a recomputed unit: the host waits for the stream to finish the
  // recomputed call kRecomputeLag calls back (CPU device only; engine/recompute.h).
  void wait_for_lagging_call();
  void recomputed_call_done();
  // Debug faults (engine/fault_injection.h) due at the start of this step / after a unit's
  // backward.
  void inject_step_fault();
  void inject_gradient_fault(FlatUnit& unit);
  void release_on(Stream& stream, Buffer buffer);
  // Timeline (when the world records a trace): the compute work enqueued between the two calls
  // becomes one slice.
  std::shared_ptr<std::int64_t> trace_begin();
  void trace_end(const std::shared_ptr<std::int64_t>& begin, std::string name);

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
  std::vector<Activations> activations_;
  std::vector<RecomputePolicy> recompute_;  // per unit
  bool bound_recompute_lag_ = false;        // the device frees only when the stream gets there
  std::vector<std::unique_ptr<Event>> lag_events_;  // kRecomputeLag, reused in turn
  std::size_t recomputed_calls_ = 0;                // in this micro-batch
  // cpu_checkpointing only: per unit, whether its input (the previous unit's output) waits on the
  // host from its forward to its backward, and the copies that move it.
  std::vector<bool> input_offloaded_;
  std::unique_ptr<CheckpointOffload> checkpoints_;
  Buffer loss_buffer_;  // one float the last unit writes the micro-batch loss to
  std::unique_ptr<GradientChecks> checks_;
  std::unique_ptr<ParameterGatherer> gatherer_;
  std::unique_ptr<GradientReducer> reducer_;
  bool evaluating_ = false;  // inside evaluate(): units keep nothing for a backward
  // A pipeline stage's part (zero_trainer_pipeline.cc): the first unit that computes (lent
  // copies come first), the gradient its last unit receives, whether backward hands the first
  // unit's input gradient out instead of freeing it, the outputs of micro-batches in flight.
  std::size_t first_computing_ = 0;
  std::vector<bool> counted_;  // per unit: adds to the gradient norm (not a lent copy)
  Tensor stage_grad_output_;
  bool keep_grad_input_ = false;
  std::vector<std::pair<int, std::vector<Activations>>> in_flight_;
  std::vector<std::pair<int, std::vector<Activations>>> awaiting_weight_;  // split backward
  bool losses_in_slots_ = false;           // the loss stage's losses of this step wait there
  Buffer micro_batch_loss_slots_;          // device: one float per micro-batch of the step
  int micro_batches_ = 0;  // since the last step
  double loss_sum_ = 0.0;  // this rank's micro-batch losses since the last step
  std::int64_t steps_taken_ = 0;      // step() calls, skipped ones included
  std::int64_t optimizer_steps_ = 0;  // updates applied (Adam's bias correction counts these)
  // offload_optimizer only. The last member: its host stream is drained first.
  std::unique_ptr<HostOptimizer> host_;
};

}  // namespace zest
