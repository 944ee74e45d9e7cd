// One model chunk of a pipeline stage, run micro-batch by micro-batch in the order a schedule
// gives (pipeline/schedule.h), several micro-batches in flight at once. It owns what the
// schedule keeps between actions: the passes whose forward ran and whose backward has not
// (engine/micro_batch_pass.h), the passes awaiting their weight gradient (split backward), the
// loss of each micro-batch of the step (on the loss pipeline stage), and the count of backwards
// that says which one is the step's last; it drives the chunk's ZeroTrainer through its hooks (one
// unit's forward or backward, the start of a backward, the step's totals and finish). Each
// micro-batch runs on its own replica of the chunk's units, since units keep what their backward
// reads in themselves. Invariant: every rank of the chunk's data-parallel group makes the same
// calls in the same order (the trainer's reductions are collectives).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/micro_batch_pass.h"
#include "engine/zero_trainer.h"
#include "runtime/world.h"

namespace zest {

class PipelineStageRunner {
 public:
  // `trainer` trains `replicas.front()` with gradient_accumulation_steps = the step's
  // micro-batches; `replicas` holds one replica of the chunk per micro-batch (borrowed). The
  // trainer and the replicas outlive the runner, and `context` is the trainer's.
  PipelineStageRunner(RankContext& context, ZeroTrainer& trainer, std::vector<Module*> replicas);

  // Forward of micro-batch `micro_batch` (0-based in the step): the chunk's first unit reads
  // `batch.inputs` (received activations, or the tokens on the first pipeline stage); the loss unit
  // reads `batch.targets`. Returns the chunk's output, valid until this micro-batch's backward has
  // been enqueued (empty when the chunk ends in the loss, which is kept for step_totals()).
  // `batch` must stay valid until the backward.
  Tensor forward(int micro_batch, const Batch& batch);
  // Backward of `micro_batch` from `grad_output`, the gradient of the chunk's output (empty on
  // the loss pipeline stage). Returns the gradient of the chunk's input and the buffer that owns it
  // (empty on the first pipeline stage, whose input is tokens): free it in stream order after its
  // send. The step's last backward reduces as the pipeline stage plan says.
  Tensor backward(int micro_batch, const Batch& batch, const Tensor& grad_output,
                  Buffer& grad_input_owner);
  // Split backward (the zero-bubble schedules' B and W), where splits_backward() says the
  // trainer can: backward_input is backward's input-gradient half (no parameter gradient,
  // nothing reduced, the micro-batch's outputs kept); backward_weight adds the parameter
  // gradients and counts as the micro-batch's backward. `batch` stays valid until then.
  bool splits_backward() const { return trainer_.splits_backward(); }
  Tensor backward_input(int micro_batch, const Batch& batch, const Tensor& grad_output,
                        Buffer& grad_input_owner);
  void backward_weight(int micro_batch, const Batch& batch);
  // Forward only, between steps (a pipeline's evaluation), on the first replica: the chunk's
  // output and the buffer that owns it (empty on the loss pipeline stage, whose loss
  // evaluation_loss() then reads, waiting for compute).
  Tensor evaluate(const Batch& batch, Buffer& output_owner);
  float evaluation_loss();
  // After the step's last backward: what this rank adds to the step's all-reduce, its loss a
  // `loss_ranks`-th of the mean over its micro-batches (the loss pipeline stage's; 0 elsewhere).
  ZeroTrainer::StepTotals step_totals(int loss_ranks);
  StepStats finish_step(float lr, const ZeroTrainer::StepTotals& summed);
  // Sums unit `unit`'s reduced gradient over `group` on the comm stream, after the step's
  // reductions (ZeroTrainer::reduced_gradient says what is summed and why it may be).
  void sum_reduced_gradient(std::size_t unit, Communicator& group, const std::string& label);

 private:
  using Held = std::vector<std::pair<int, MicroBatchPass>>;
  // The pass micro-batch `micro_batch` left in `held`, taken out of it.
  static MicroBatchPass take(Held& held, int micro_batch, const char* what);
  // Counts a backward; whether it is the step's last.
  bool count_backward();

  RankContext& context_;
  ZeroTrainer& trainer_;
  std::vector<Module*> replicas_;  // borrowed
  int micro_batches_ = 0;        // the step's: gradient_accumulation_steps of the trainer
  int backwards_ = 0;            // in this step
  Held in_flight_;               // forward done, backward not
  Held awaiting_weight_;         // split backward: input gradient done, weight gradient not
  Buffer micro_batch_losses_;            // device: one float per micro-batch of the step
  bool losses_waiting_ = false;          // the loss pipeline stage's losses of this step wait there
};

}  // namespace zest
