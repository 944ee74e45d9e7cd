// The Trainer of the ZeRO engine: drives gather / release / reduce around each unit's forward
// and backward at the configured stage, and runs the sharded optimizer step. Built by
// Engine::shard(); see optim/engine.h for the contract and optim/flat_unit.h for which buffers
// each stage keeps.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "optim/engine.h"
#include "optim/flat_unit.h"
#include "optim/gather_ring.h"

namespace zest {

class ZeroTrainer final : public Trainer {
 public:
  ZeroTrainer(RankContext& context, const EngineOptions& options, Module& module,
              std::unique_ptr<Optimizer> optimizer);
  ~ZeroTrainer() override;

  float forward_backward(const Batch& batch) override;
  StepStats step(float lr) override;
  std::vector<float> full_parameter(const std::string& name) override;
  std::vector<std::string> parameter_names() const override;
  const std::vector<ShardLayout>& layouts() const override { return layouts_; }
  MemoryPrediction predicted_memory() const override;
  int stage() const override { return options_.stage; }
  std::int64_t steps_taken() const override { return steps_taken_; }

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

  void allocate_state();
  void initialize_parameters();
  // The full flat parameters of `unit` for compute work enqueued next (gathering at stage 3).
  float* acquire_params(FlatUnit& unit);
  void release_params(FlatUnit& unit);
  // The full flat gradient buffer backward accumulates into (a bucket at stages 2-3).
  float* gradient_target(FlatUnit& unit);
  void run_forward(const Batch& batch, float* loss);
  void run_backward(const Batch& batch, float* loss, bool reduce_now);
  void reduce_gradients(FlatUnit& unit);
  void release_on(Stream& stream, Buffer buffer);
  // Local sum of squares over the gradient elements this rank updates.
  double local_gradient_square_sum();
  void apply_optimizer(float lr, float grad_scale);
  void gather_updated_parameters();

  RankContext& context_;
  EngineOptions options_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<FlatUnit> units_;
  std::vector<ShardLayout> layouts_;
  std::unique_ptr<GatherRing> ring_;
  std::vector<Activations> activations_;
  Buffer loss_buffer_;  // one float the last unit writes the micro-batch loss to
  std::vector<std::unique_ptr<Event>> backward_done_;  // per unit: its gradients are written
  std::vector<std::unique_ptr<Event>> bucket_released_;  // per unit: its bucket is freed
  std::deque<int> buckets_in_flight_;  // units whose bucket the comm stream has yet to free
  static constexpr std::size_t kLiveBuckets = 2;
  std::unique_ptr<Event> optimizer_done_;
  std::unique_ptr<Event> parameters_ready_;
  int micro_batches_ = 0;  // since the last step
  double loss_sum_ = 0.0;      // this rank's micro-batch losses since the last step
  std::int64_t steps_taken_ = 0;
};

}  // namespace zest
