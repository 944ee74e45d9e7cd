// The Trainer of the ZeRO engine: drives gather / release / reduce around each unit's forward
// and backward at the configured stage, and runs the sharded optimizer step. Built by
// Engine::shard(); see engine/engine.h for the contract and engine/flat_unit.h for which buffers
// each stage keeps. The class is split by phase: zero_trainer.cc (state, forward, backward,
// gradient reduction), zero_trainer_step.cc (norm, loss scaling, optimizer, gather) and
// zero_trainer_offload.cc (the optimizer in host memory: offload_optimizer).
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "kernels/gradient_statistics.h"
#include "engine/engine.h"
#include "engine/flat_unit.h"
#include "engine/gather_ring.h"
#include "optim/loss_scaler.h"
#include "engine/model_state.h"
#include "engine/stage_plan.h"

namespace zest {

class ZeroTrainer final : public Trainer {
 public:
  ZeroTrainer(RankContext& context, const EngineOptions& options, Module& module,
              std::unique_ptr<Optimizer> optimizer);
  ~ZeroTrainer() override;

  float forward_backward(const Batch& batch) override;
  StepStats step(float lr) override;
  float evaluate(const Batch& batch) override;
  std::vector<float> full_parameter(const std::string& name) override;
  std::vector<std::string> parameter_names() const override;
  const std::vector<ShardLayout>& layouts() const override { return layouts_; }
  MemoryPrediction predicted_memory() const override;
  // The units' parameter shapes, for engine/model_state.h.
  ModelStateShape model_state_shape() const;
  int stage() const override { return options_.stage; }
  std::int64_t steps_taken() const override { return steps_taken_; }
  const EngineOptions& options() const override { return options_; }
  std::vector<StateShard> state_shards(std::size_t unit) override;
  void state_loaded() override;
  TrainerCounters counters() const override;
  void set_counters(const TrainerCounters& counters) override;

  // For tests: how many units the gather ring holds now (stage 3; 0 otherwise).
  std::size_t gathered_units() const { return ring_ ? ring_->resident_count() : 0; }

 private:
  class Context;
  struct Activations {
    Buffer output;      // this unit's forward output
    Buffer grad_input;  // the gradient of this unit's input, made in backward
    Tensor output_view;
    Tensor grad_input_view;
  };
  // The fp32 views one unit call works on, and what must happen after it.
  struct CallViews {
    float* params = nullptr;
    float* grads = nullptr;
    std::vector<float*> borrowed_params;
    std::vector<float*> borrowed_grads;
    struct Fold {  // fp32 gradients to add into a 2-byte gradient buffer after the call
      void* target;
      const float* source;
      std::size_t count;
    };
    std::vector<Fold> folds;
    std::vector<Buffer> scratch;  // fp32 copies, freed in stream order after the call
  };

  // For an out-of-memory in a micro-batch: the planner's estimate at this micro-batch and the
  // smallest change that fits (zero_trainer_memory.cc).
  std::string training_memory_advice(const Batch& batch) const;
  void allocate_state();
  // allocate_state(), with an out-of-memory that says what the model state needs and what fits.
  void allocate_model_state();
  void initialize_parameters();
  std::size_t element_size() const { return dtype_size(options_.compute_dtype); }
  // The unit's full flat parameters in the compute dtype, for compute work enqueued next
  // (gathered at stage 3).
  void* acquire_params(FlatUnit& unit);
  void release_params(FlatUnit& unit);
  // overlap_comm false: `stream` starts after the compute enqueued so far / compute waits for
  // what `stream` has enqueued so far.
  void wait_for_compute(Stream& stream);
  void compute_waits_for(Stream& stream);
  // The full flat gradient buffer backward accumulates into (a bucket at stages 2-3).
  void* gradient_target(FlatUnit& unit);
  float* fp32_params(void* params, std::size_t count, CallViews& views);
  float* fp32_grads(void* target, std::size_t count, CallViews& views);
  CallViews prepare_call(FlatUnit& unit, bool backward);
  void finish_call(FlatUnit& unit, CallViews& views);
  void run_forward(const Batch& batch);
  void run_backward(const Batch& batch, bool reduce_now);
  void reduce_gradients(FlatUnit& unit);
  // Debug faults (engine/fault_injection.h) due at the start of this step / after a unit's
  // backward.
  void inject_step_fault();
  void inject_gradient_fault(FlatUnit& unit);
  // Throws the kDivergence Error naming the step, and each rank's first unit whose local
  // gradient was not finite (a collective).
  [[noreturn]] void raise_divergence(std::int64_t step);
  void release_on(Stream& stream, Buffer buffer);
  // Timeline (when the world records a trace): the compute work enqueued between the two calls
  // becomes one slice.
  std::shared_ptr<std::int64_t> trace_begin();
  void trace_end(const std::shared_ptr<std::int64_t>& begin, std::string name);

  // zero_trainer_step.cc
  // Fills local_checks_: each unit's pre-reduction check, and the local norm of the reduced
  // gradients this rank updates (the last slot).
  void inspect_local_gradients();
  void apply_optimizer(float lr, float grad_scale);
  void update_unit(FlatUnit& unit, const UpdateArgs& args);
  void zero_gradients();
  void gather_updated_parameters();

  // zero_trainer_offload.cc: zero_optimization.offload_optimizer.
  bool offloaded() const { return options_.offload_optimizer.enabled(); }
  // The master shard, the optimizer states and the transfer shard, in the host arena.
  void allocate_offload_state();
  // After the last micro-batch's reduction of `unit` (comm stream): its gradient shard to the
  // host.
  void copy_gradients_to_host(FlatUnit& unit);
  // The optimizer on the host stream over `unit`'s host shards, then (comm stream) the updated
  // parameter shard back to the device and, at stages 1-2, its all-gather.
  void update_unit_on_host(FlatUnit& unit, const UpdateArgs& args);
  // After a checkpoint load: the host's fp32 copy of the parameters from the loaded shard.
  void offload_state_loaded();

  RankContext& context_;
  const Module& module_;  // outlives the trainer (Engine::shard's contract)
  EngineOptions options_;
  StagePlan plan_;  // from options_.stage
  std::unique_ptr<Optimizer> optimizer_;
  LossScaler scaler_;
  std::vector<FlatUnit> units_;
  std::vector<ShardLayout> layouts_;
  std::unique_ptr<GatherRing> ring_;
  std::vector<Activations> activations_;
  Buffer loss_buffer_;  // one float the last unit writes the micro-batch loss to
  std::vector<std::unique_ptr<Event>> backward_done_;    // per unit: its gradients are written
  std::vector<std::unique_ptr<Event>> bucket_released_;  // per unit: its bucket is freed
  std::deque<int> buckets_in_flight_;  // units whose bucket the comm stream has yet to free
  std::unique_ptr<Event> optimizer_done_;
  std::unique_ptr<Event> serialize_;  // overlap_comm false: orders compute and communication
  // Stages 1-2: per unit, the all-gather of its updated parameters; the next forward waits for
  // it when it reaches the unit. With the optimizer offloaded, also at stage 3: the updated
  // shard's copy back to the device, which the unit's next gather (prefetch stream) waits for.
  std::vector<std::unique_ptr<Event>> unit_gathered_;
  std::vector<bool> awaiting_gather_;
  // Device memory, units + 1 GradientStatistics: slot u, unit u's own gradient before it was
  // reduced (checked in compute-stream order before each reduction), so a divergence can be
  // traced to the rank and unit where it arose; the last slot, the step's local gradient norm.
  // Read back once per step into local_checks_ (one copy, not one per unit).
  Buffer gradient_checks_;
  std::vector<GradientStatistics> local_checks_;
  GradientStatistics* gradient_check(std::size_t slot) {
    return gradient_checks_.as<GradientStatistics>() + slot;
  }
  bool evaluating_ = false;  // inside evaluate(): units keep nothing for a backward
  int micro_batches_ = 0;  // since the last step
  double loss_sum_ = 0.0;  // this rank's micro-batch losses since the last step
  std::int64_t steps_taken_ = 0;      // step() calls, skipped ones included
  std::int64_t optimizer_steps_ = 0;  // updates applied (Adam's bias correction counts these)
  // Offload: per unit, the gradient shard has reached the host / the host has updated the unit;
  // and the stream the optimizer runs on over host memory. The stream is the last member: it is
  // drained before the events and buffers its work uses are destroyed.
  // 2-byte offload: the host's fp32 widening of a unit's gradient shard, as long as the largest
  // shard, reused by every unit (the host stream updates them in turn); empty otherwise.
  Buffer host_widened_;
  std::vector<std::unique_ptr<Event>> gradients_on_host_;
  std::vector<std::unique_ptr<Event>> host_updated_;
  std::unique_ptr<Stream> host_stream_;
};

}  // namespace zest
