#include "pipeline/stage_runner.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "base/error.h"
#include "runtime/host_copies.h"

namespace zest {

namespace {

// Note: on the CPU device a buffer frees at once, while the rank's streams may still run work
// queued on it. A pass that a failure unwinds (a peer's failed transfer inside a backward, say)
// must wait for the streams before its buffers go; declared after the pass, this waits first.
class WaitForStreamsOnFailure {
 public:
  explicit WaitForStreamsOnFailure(RankContext& context)
      : context_(context), failures_(std::uncaught_exceptions()) {}
  ~WaitForStreamsOnFailure() {
    if (std::uncaught_exceptions() <= failures_) return;
    for (Stream* stream : {&context_.compute, &context_.comm, &context_.prefetch}) {
      try {
        stream->synchronize();
      } catch (...) {
        // The failure being thrown, or a peer's echo of it, is the one reported.
      }
    }
  }
  WaitForStreamsOnFailure(const WaitForStreamsOnFailure&) = delete;
  WaitForStreamsOnFailure& operator=(const WaitForStreamsOnFailure&) = delete;

 private:
  RankContext& context_;
  int failures_;
};

}  // namespace

PipelineStageRunner::PipelineStageRunner(RankContext& context, ZeroTrainer& trainer,
                                         std::vector<Module*> replicas)
    : context_(context),
      trainer_(trainer),
      replicas_(std::move(replicas)),
      micro_batches_(trainer.options().gradient_accumulation_steps) {}

MicroBatchPass PipelineStageRunner::take(Held& held, int micro_batch, const char* what) {
  const auto at = std::find_if(held.begin(), held.end(),
                               [&](const auto& entry) { return entry.first == micro_batch; });
  if (at == held.end()) {
    throw Error(ErrorKind::kUsage, std::string(what) + " of micro-batch " +
                                       std::to_string(micro_batch) + " out of order");
  }
  MicroBatchPass pass = std::move(at->second);
  held.erase(at);
  return pass;
}

bool PipelineStageRunner::count_backward() {
  ++backwards_;
  return backwards_ == micro_batches_;
}

Tensor PipelineStageRunner::forward(int micro_batch, const Batch& batch) {
  if (micro_batch < 0 || micro_batch >= micro_batches_) {
    throw Error(ErrorKind::kUsage, "forward of micro-batch " + std::to_string(micro_batch) +
                                       " in a step of " + std::to_string(micro_batches_));
  }
  for (const auto& held : in_flight_) {
    if (held.first == micro_batch) {
      throw Error(ErrorKind::kUsage, "forward of micro-batch " + std::to_string(micro_batch) +
                                         " again before its backward");
    }
  }
  if (micro_batch_losses_.empty()) {
    micro_batch_losses_ = context_.allocator().allocate(
        static_cast<std::size_t>(micro_batches_) * sizeof(float), Category::kWorkspace);
    context_.device.fill_zero(context_.compute, micro_batch_losses_.data(), micro_batch_losses_.bytes());
  }
  MicroBatchPass pass =
      trainer_.make_pass(replicas_.at(static_cast<std::size_t>(micro_batch))->units());
  const WaitForStreamsOnFailure wait(context_);
  const std::size_t units = trainer_.layouts().size();
  for (std::size_t u = 0; u < units; ++u) trainer_.forward_unit(u, batch, pass);
  const Tensor output = pass.output();
  if (!output.data) {
    // The loss pipeline stage: the loss unit wrote this micro-batch's loss; keep it past the next
    // one.
    context_.device.copy(context_.compute, micro_batch_losses_.as<float>() + micro_batch,
                         trainer_.loss_buffer(), sizeof(float));
    losses_waiting_ = true;
  }
  in_flight_.emplace_back(micro_batch, std::move(pass));
  return output;
}

Tensor PipelineStageRunner::backward(int micro_batch, const Batch& batch, const Tensor& grad_output,
                                     Buffer& grad_input_owner) {
  MicroBatchPass pass = take(in_flight_, micro_batch, "backward");
  const WaitForStreamsOnFailure wait(context_);
  trainer_.begin_backward(count_backward());
  pass.set_grad_output(grad_output);
  for (std::size_t u = trainer_.layouts().size(); u-- > 0;) trainer_.backward_unit(u, batch, pass);
  return pass.take_grad_input(grad_input_owner);
}

Tensor PipelineStageRunner::backward_input(int micro_batch, const Batch& batch,
                                           const Tensor& grad_output, Buffer& grad_input_owner) {
  MicroBatchPass pass = take(in_flight_, micro_batch, "backward-input");
  const WaitForStreamsOnFailure wait(context_);
  pass.set_grad_output(grad_output);
  for (std::size_t u = trainer_.layouts().size(); u-- > 0;) {
    trainer_.backward_unit(u, batch, pass, ZeroTrainer::BackwardPart::kInput);
  }
  pass.set_grad_output({});  // read by the input gradient only
  const Tensor grad_input = pass.take_grad_input(grad_input_owner);
  awaiting_weight_.emplace_back(micro_batch, std::move(pass));
  return grad_input;
}

void PipelineStageRunner::backward_weight(int micro_batch, const Batch& batch) {
  MicroBatchPass pass = take(awaiting_weight_, micro_batch, "backward-weight");
  const WaitForStreamsOnFailure wait(context_);
  trainer_.begin_backward(count_backward());
  for (std::size_t u = trainer_.layouts().size(); u-- > 0;) {
    trainer_.backward_unit(u, batch, pass, ZeroTrainer::BackwardPart::kWeight);
  }
}

Tensor PipelineStageRunner::evaluate(const Batch& batch, Buffer& output_owner) {
  if (backwards_ != 0 || !in_flight_.empty() || !awaiting_weight_.empty()) {
    throw Error(ErrorKind::kUsage, "evaluate() between micro-batches; evaluate between steps");
  }
  MicroBatchPass pass = trainer_.make_pass(replicas_.front()->units(), true);
  const std::size_t units = trainer_.layouts().size();
  for (std::size_t u = 0; u < units; ++u) trainer_.forward_unit(u, batch, pass);
  const Tensor output = pass.take_output(output_owner);
  trainer_.release_pass(pass);
  return output;
}

float PipelineStageRunner::evaluation_loss() {
  float loss = 0.0f;
  read_to_host(context_.device, context_.compute, &loss, trainer_.loss_buffer(), sizeof loss);
  return loss;
}

ZeroTrainer::StepTotals PipelineStageRunner::step_totals(int loss_ranks) {
  double loss_sum = 0.0;  // this rank's micro-batch losses of the step
  if (losses_waiting_) {
    std::vector<float> losses(static_cast<std::size_t>(micro_batches_));
    read_to_host(context_.device, context_.compute, losses.data(), micro_batch_losses_.data(),
                 losses.size() * sizeof(float));
    for (float loss : losses) loss_sum += loss;
    losses_waiting_ = false;
  }
  return trainer_.step_totals(loss_sum / micro_batches_ / loss_ranks);
}

StepStats PipelineStageRunner::finish_step(float lr, const ZeroTrainer::StepTotals& summed) {
  backwards_ = 0;
  return trainer_.finish_step(lr, summed);
}

void PipelineStageRunner::sum_reduced_gradient(std::size_t unit, Communicator& group,
                                               const std::string& label) {
  const Tensor reduced = trainer_.reduced_gradient(unit);
  group.label_next(label.c_str());
  group.all_reduce(context_.comm, reduced.data, reduced.data, reduced.numel(), reduced.dtype,
                   Reduction::kSum);
  trainer_.reduced_gradient_changed(unit);
}

}  // namespace zest
