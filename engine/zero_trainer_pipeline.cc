// The ZeRO trainer as one pipeline stage: forward and backward of one micro-batch at a time, in
// the order a schedule gives (pipeline/schedule.h), with several micro-batches in flight.
// Note: what a micro-batch keeps from its forward to its backward is of two kinds. The units'
// outputs are the engine's (activations_): each micro-batch in flight keeps its own set here
// and swaps it in for its backward. What a unit keeps inside itself (a layer's pre-activation)
// is the unit's: one Unit object holds one micro-batch's, so the pipeline runs each micro-batch
// on a replica of the units (use_units), made from the same model description.
#include <algorithm>
#include <string>

#include "base/error.h"
#include "engine/zero_trainer.h"
#include "runtime/host_copies.h"

namespace zest {

namespace {

// The outputs micro-batch `micro_batch` left in `held`, taken out of it.
template <typename Held>
auto take_in_flight(Held& held, int micro_batch, const char* what) {
  const auto at = std::find_if(held.begin(), held.end(),
                               [&](const auto& entry) { return entry.first == micro_batch; });
  if (at == held.end()) {
    throw Error(ErrorKind::kUsage, std::string(what) + " of micro-batch " +
                                       std::to_string(micro_batch) + " out of order");
  }
  auto activations = std::move(at->second);
  held.erase(at);
  return activations;
}

}  // namespace

void ZeroTrainer::use_units(const std::vector<Unit*>& units) {
  if (units.size() != units_.size()) {
    throw Error(ErrorKind::kUsage, "use_units: " + std::to_string(units.size()) +
                                       " units for a trainer of " +
                                       std::to_string(units_.size()));
  }
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (units[u]->name() != units_[u].layout.unit_name()) {
      throw Error(ErrorKind::kUsage, "use_units: unit " + std::to_string(u) + " is '" +
                                         units[u]->name() + "', the trainer's is '" +
                                         units_[u].layout.unit_name() + "'");
    }
    units_[u].unit = units[u];
  }
}

Tensor ZeroTrainer::forward_micro_batch(int micro_batch, const Batch& batch) {
  const int count = options_.gradient_accumulation_steps;
  if (micro_batch < 0 || micro_batch >= count) {
    throw Error(ErrorKind::kUsage, "forward of micro-batch " + std::to_string(micro_batch) +
                                       " in a step of " + std::to_string(count));
  }
  for (const auto& held : in_flight_) {
    if (held.first == micro_batch) {
      throw Error(ErrorKind::kUsage, "forward of micro-batch " + std::to_string(micro_batch) +
                                         " again before its backward");
    }
  }
  if (micro_batches_ == 0 && in_flight_.empty()) {
    // The step's first forward: later collectives' errors say which step they belong to.
    context_.communicator.begin_step(steps_taken_ + 1);
  }
  if (micro_batch_loss_slots_.empty()) {
    micro_batch_loss_slots_ = context_.allocator().allocate(
        static_cast<std::size_t>(count) * sizeof(float), Category::kWorkspace);
    context_.device.fill_zero(context_.compute, micro_batch_loss_slots_.data(),
                              micro_batch_loss_slots_.bytes());
  }
  recomputed_calls_ = 0;
  activations_ = std::vector<Activations>(units_.size());
  run_forward(batch);
  const Tensor output = activations_.back().output_view;
  if (!output.data) {
    // The loss stage: the loss unit wrote this micro-batch's loss; keep it past the next one.
    context_.device.copy(context_.compute, micro_batch_loss_slots_.as<float>() + micro_batch,
                         loss_buffer_.data(), sizeof(float));
    losses_in_slots_ = true;
  }
  in_flight_.emplace_back(micro_batch, std::move(activations_));
  activations_ = std::vector<Activations>(units_.size());
  return output;
}

Tensor ZeroTrainer::backward_micro_batch(int micro_batch, const Batch& batch,
                                         const Tensor& grad_output, Buffer& grad_input_owner) {
  activations_ = take_in_flight(in_flight_, micro_batch, "backward");
  ++micro_batches_;
  const bool last = micro_batches_ == options_.gradient_accumulation_steps;
  stage_grad_output_ = grad_output;
  keep_grad_input_ = true;
  recomputed_calls_ = 0;
  try {
    run_backward(batch, last);
  } catch (...) {
    stage_grad_output_ = {};
    keep_grad_input_ = false;
    throw;
  }
  stage_grad_output_ = {};
  keep_grad_input_ = false;
  Activations& first = activations_[first_computing_];
  grad_input_owner = std::move(first.grad_input);
  const Tensor grad_input = grad_input_owner.empty() ? Tensor{} : first.grad_input_view;
  activations_ = std::vector<Activations>(units_.size());
  return grad_input;
}

void ZeroTrainer::sum_reduced_gradient(std::size_t unit, Communicator& group,
                                       const std::string& label) {
  FlatUnit& flat = units_.at(unit);
  if (offloaded()) {
    // Note: the offloaded optimizer took its gradient shard to the host at the last reduction.
    throw Error(ErrorKind::kConfig,
                "zero_optimization.offload_optimizer: not with units tied across pipeline "
                "stages yet (unit '" + flat.layout.unit_name() + "')");
  }
  const std::size_t shard_begin = flat.layout.shard_range(context_.rank).begin;
  const std::size_t offset = plan_.optimizer_first(shard_begin) - plan_.grads_first(shard_begin);
  const std::size_t count =
      plan_.optimizer_length(flat.layout.flat_length(), flat.layout.shard_length());
  void* reduced = static_cast<char*>(flat.grads.data()) + offset * element_size();
  group.label_next(label.c_str());
  group.all_reduce(context_.comm, reduced, reduced, count, options_.compute_dtype, Reduction::kSum);
}

bool ZeroTrainer::splits_backward() const {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    if (!counted_[u]) continue;
    if (!units_[u].unit->supports_split_backward() || recompute_[u] != RecomputePolicy::kNone) {
      return false;
    }
  }
  return true;
}

Tensor ZeroTrainer::backward_input_micro_batch(int micro_batch, const Batch& batch,
                                               const Tensor& grad_output,
                                               Buffer& grad_input_owner) {
  activations_ = take_in_flight(in_flight_, micro_batch, "backward-input");
  stage_grad_output_ = grad_output;
  try {
    for (std::size_t u = units_.size(); u-- > first_computing_;) {
      FlatUnit& unit = units_[u];
      if (!counted_[u]) continue;
      // Not a backward call for the engine: no gradient target is made (grad() refuses), so a
      // later micro-batch's input gradient never meets this one's weight gradient in a bucket.
      CallViews views = prepare_call(unit, false);
      call_unit(unit, batch, views, &Unit::backward_input,
                "backward-input " + unit.layout.unit_name());
      finish_call(unit, views);
      // The gradient this unit received: it kept what its weight gradient needs.
      if (u + 1 < units_.size()) release_on(context_.compute, std::move(activations_[u + 1].grad_input));
    }
  } catch (...) {
    stage_grad_output_ = {};
    throw;
  }
  stage_grad_output_ = {};
  Activations& first = activations_[first_computing_];
  grad_input_owner = std::move(first.grad_input);
  const Tensor grad_input = grad_input_owner.empty() ? Tensor{} : first.grad_input_view;
  awaiting_weight_.emplace_back(micro_batch, std::move(activations_));
  activations_ = std::vector<Activations>(units_.size());
  return grad_input;
}

void ZeroTrainer::backward_weight_micro_batch(int micro_batch, const Batch& batch) {
  activations_ = take_in_flight(awaiting_weight_, micro_batch, "backward-weight");
  ++micro_batches_;
  reducer_->backward_begins(micro_batches_ == options_.gradient_accumulation_steps);
  for (std::size_t u = units_.size(); u-- > 0;) {
    FlatUnit& unit = units_[u];
    if (counted_[u]) {
      CallViews views = prepare_call(unit, true);
      call_unit(unit, batch, views, &Unit::backward_weight,
                "backward-weight " + unit.layout.unit_name());
      finish_call(unit, views);
      inject_gradient_fault(unit);
      // Its output was the next unit's input, whose weight gradient ran before this one.
      release_on(context_.compute, std::move(activations_[u].output));
    }
    reducer_->unit_done(unit);
  }
  activations_ = std::vector<Activations>(units_.size());
}

Tensor ZeroTrainer::evaluate_micro_batch(const Batch& batch, Buffer& output_owner) {
  if (micro_batches_ != 0 || !in_flight_.empty() || !awaiting_weight_.empty()) {
    throw Error(ErrorKind::kUsage, "evaluate() between micro-batches; evaluate between steps");
  }
  activations_ = std::vector<Activations>(units_.size());
  evaluating_ = true;
  try {
    run_forward(batch);
  } catch (...) {
    evaluating_ = false;
    throw;
  }
  evaluating_ = false;
  Activations& last = activations_.back();
  output_owner = std::move(last.output);
  const Tensor output = output_owner.empty() ? Tensor{} : last.output_view;
  for (Activations& unit : activations_) release_on(context_.compute, std::move(unit.output));
  activations_ = std::vector<Activations>(units_.size());
  return output;
}

float ZeroTrainer::evaluation_loss() {
  float loss = 0.0f;
  read_to_host(context_.device, context_.compute, &loss, loss_buffer_.data(), sizeof loss);
  return loss;
}

}  // namespace zest
