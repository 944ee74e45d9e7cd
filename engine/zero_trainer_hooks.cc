// ZeroTrainer's hooks: one unit's forward or backward in a micro-batch's pass, the start of a
// pass's backward (whether its gradients are reduced now), and the reduced gradient a caller may
// sum across copies. forward_backward() and evaluate() drive them in the plain order; a pipeline
// stage's runner (pipeline/stage_runner.h) in a schedule's, several passes in flight at once.
#include <string>
#include <utility>

#include "base/error.h"
#include "engine/zero_trainer.h"

namespace zest {

MicroBatchPass ZeroTrainer::make_pass(const std::vector<Unit*>& units, bool evaluating) const {
  if (units.size() != units_.size()) {
    throw Error(ErrorKind::kUsage, "a pass over " + std::to_string(units.size()) +
                                       " units for a trainer of " +
                                       std::to_string(units_.size()));
  }
  for (std::size_t u = 0; u < units.size(); ++u) {
    if (units[u]->name() != units_[u].layout.unit_name()) {
      throw Error(ErrorKind::kUsage, "a pass's unit " + std::to_string(u) + " is '" +
                                         units[u]->name() + "', the trainer's is '" +
                                         units_[u].layout.unit_name() + "'");
    }
  }
  MicroBatchPass pass;
  pass.units_ = units;
  pass.activations_.resize(units_.size());
  pass.first_computing_ = first_computing_;
  pass.evaluating_ = evaluating;
  return pass;
}

void ZeroTrainer::wait_for_lagging_call(const MicroBatchPass& pass) {
  if (bound_recompute_lag_ && pass.recomputed_calls_ >= kRecomputeLag) {
    lag_events_[pass.recomputed_calls_ % kRecomputeLag]->synchronize();
  }
  if (checkpoints_) checkpoints_->bound_copies();
}

void ZeroTrainer::recomputed_call_done(MicroBatchPass& pass) {
  if (!bound_recompute_lag_) return;
  context_.compute.record(*lag_events_[pass.recomputed_calls_ % kRecomputeLag]);
  ++pass.recomputed_calls_;
}

void ZeroTrainer::forward_unit(std::size_t u, const Batch& batch, MicroBatchPass& pass) {
  if (!counted_.at(u)) return;  // a lent copy runs nothing
  FlatUnit& unit = units_[u];
  const RecomputePolicy recompute = recompute_of(u, pass);
  reducer_->forward_call_begins();
  CallViews views = prepare_call(unit, pass, false, recompute != RecomputePolicy::kNone);
  call_unit(unit, batch, pass, views, &Unit::forward, "forward " + unit.layout.unit_name(),
            recompute == RecomputePolicy::kFull ? CallKind::kCheckpoint : CallKind::kPlain);
  finish_call(unit, views);
  if (recompute != RecomputePolicy::kNone && input_offloaded_[u]) {
    // This forward was the input's last reader until backward.
    MicroBatchPass::UnitActivations& input = pass.activations_[u - 1];
    checkpoints_->offload(u - 1, std::move(input.output));
    input.output_view.data = nullptr;
  }
  if (recompute != RecomputePolicy::kNone) recomputed_call_done(pass);
  reducer_->forward_call_done();
}

void ZeroTrainer::begin_backward(bool last_micro_batch) {
  reducer_->backward_begins(last_micro_batch);
}

void ZeroTrainer::backward_unit(std::size_t u, const Batch& batch, MicroBatchPass& pass,
                                BackwardPart part) {
  FlatUnit& unit = units_.at(u);
  switch (part) {
    case BackwardPart::kWhole:
      if (counted_[u]) backward_whole(unit, batch, pass);
      reducer_->unit_done(unit);  // a lent copy: only its gradient is reduced
      return;
    case BackwardPart::kInput:
      if (counted_[u]) backward_input(unit, batch, pass);
      return;
    case BackwardPart::kWeight:
      if (counted_[u]) backward_weight(unit, batch, pass);
      reducer_->unit_done(unit);
      return;
  }
}

void ZeroTrainer::backward_whole(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass) {
  const auto u = static_cast<std::size_t>(unit.index);
  const RecomputePolicy recompute = recompute_[u];
  // An offloaded input comes back one unit ahead of the unit that reads it.
  if (u >= 2 && input_offloaded_[u - 1]) {
    MicroBatchPass::UnitActivations& ahead = pass.activations_[u - 2];
    ahead.output = checkpoints_->fetch(u - 2);
    ahead.output_view.data = ahead.output.data();
  }
  // One pin for the recomputation and the backward: at stage 3 the ring's gather of the unit
  // serves both.
  CallViews views = prepare_call(unit, pass, true, recompute != RecomputePolicy::kNone);
  if (input_offloaded_[u]) checkpoints_->wait_fetched(u - 1);
  if (recompute == RecomputePolicy::kFull) {
    call_unit(unit, batch, pass, views, &Unit::forward, "recompute " + unit.layout.unit_name(),
              CallKind::kRecompute);
  } else if (recompute == RecomputePolicy::kSelective) {
    call_unit(unit, batch, pass, views, &Unit::recompute, "recompute " + unit.layout.unit_name());
  }
  call_unit(unit, batch, pass, views, &Unit::backward, "backward " + unit.layout.unit_name());
  finish_call(unit, views);
  inject_gradient_fault(unit);
  // This unit's output and the gradient it received are no longer needed.
  release_on(context_.compute, std::move(pass.activations_[u].output));
  if (u + 1 < units_.size()) release_on(context_.compute, std::move(pass.activations_[u + 1].grad_input));
  if (recompute != RecomputePolicy::kNone) recomputed_call_done(pass);
}

void ZeroTrainer::backward_input(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass) {
  const auto u = static_cast<std::size_t>(unit.index);
  // Not a backward call for the engine: no gradient target is made (grad() refuses), so a
  // later micro-batch's input gradient never meets this one's weight gradient in a bucket.
  CallViews views = prepare_call(unit, pass, false);
  call_unit(unit, batch, pass, views, &Unit::backward_input,
            "backward-input " + unit.layout.unit_name());
  finish_call(unit, views);
  // The gradient this unit received: it kept what its weight gradient needs.
  if (u + 1 < units_.size()) release_on(context_.compute, std::move(pass.activations_[u + 1].grad_input));
}

void ZeroTrainer::backward_weight(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass) {
  CallViews views = prepare_call(unit, pass, true);
  call_unit(unit, batch, pass, views, &Unit::backward_weight,
            "backward-weight " + unit.layout.unit_name());
  finish_call(unit, views);
  inject_gradient_fault(unit);
  // Its output was the next unit's input, whose weight gradient ran before this one.
  release_on(context_.compute, std::move(pass.activations_[static_cast<std::size_t>(unit.index)].output));
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

void ZeroTrainer::release_pass(MicroBatchPass& pass) {
  for (MicroBatchPass::UnitActivations& unit : pass.activations_) {
    release_on(context_.compute, std::move(unit.output));
    release_on(context_.compute, std::move(unit.grad_input));
  }
}

void ZeroTrainer::run_forward(const Batch& batch, MicroBatchPass& pass) {
  for (std::size_t u = 0; u < units_.size(); ++u) forward_unit(u, batch, pass);
}

void ZeroTrainer::run_backward(const Batch& batch, MicroBatchPass& pass, bool last_micro_batch) {
  begin_backward(last_micro_batch);
  for (std::size_t u = units_.size(); u-- > 0;) backward_unit(u, batch, pass);
  // The first unit's input gradient has no reader here (its input is the batch).
  release_on(context_.compute, std::move(pass.activations_[first_computing_].grad_input));
}

Tensor ZeroTrainer::reduced_gradient(std::size_t unit) {
  FlatUnit& flat = units_.at(unit);
  const std::size_t shard_begin = flat.layout.shard_range(context_.rank).begin;
  const std::size_t offset = plan_.optimizer_first(shard_begin) - plan_.grads_first(shard_begin);
  const std::size_t count =
      plan_.optimizer_length(flat.layout.flat_length(), flat.layout.shard_length());
  void* reduced = static_cast<char*>(flat.grads.data()) + offset * element_size();
  return Tensor{reduced, {static_cast<std::int64_t>(count)}, options_.compute_dtype};
}

void ZeroTrainer::reduced_gradient_changed(std::size_t unit) {
  if (host_) host_->copy_gradients_to_host(units_.at(unit));
}

}  // namespace zest
