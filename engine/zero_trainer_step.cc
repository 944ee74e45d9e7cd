// The optimizer step of the ZeRO engine: agree on the loss, the gradient norm and (fp16) whether
// any rank overflowed; clip; update each rank's shard (on the device, or on the host when the
// optimizer is offloaded); then the parameter gatherer makes the parameters full again.
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "kernels/convert.h"
#include "engine/divergence_report.h"
#include "engine/parameter_offload.h"
#include "engine/whole_parameter_gradients.h"
#include "engine/zero_trainer.h"
#include "runtime/host_collectives.h"
#include "runtime/host_copies.h"

namespace zest {

namespace {
const char* byte_offset(const void* base, std::size_t bytes) {
  return static_cast<const char*>(base) + bytes;
}

// A rank's non-finite flag was counted, or the summed norm overflowed.
bool overflowed(const ZeroTrainer::StepTotals& summed) {
  return summed.values[2] > 0.0f || !std::isfinite(summed.values[1]);
}
}  // namespace

StepStats ZeroTrainer::step(float lr) {
  if (micro_batches_ != options_.gradient_accumulation_steps) {
    throw Error(ErrorKind::kUsage, "step() after " + std::to_string(micro_batches_) +
                                       " micro-batches; gradient_accumulation_steps is " +
                                       std::to_string(options_.gradient_accumulation_steps));
  }
  Communicator* tensor = module_.tensor_parallel_group();
  if (tensor != nullptr && options_.quantized_gradients) {
    // Before the norm and the update read them (engine/whole_parameter_gradients.h).
    share_whole_parameter_gradients(context_, *tensor, units_, plan_, options_.compute_dtype);
    if (host_) {
      for (FlatUnit& unit : units_) host_->copy_gradients_to_host(unit);
    }
  }
  // One all-reduce carries the loss, the squared gradient norm and the overflow flag.
  const int loss_ranks = context_.world_size * context_.replicas;
  StepTotals totals = step_totals(loss_sum_ / options_.gradient_accumulation_steps / loss_ranks);
  context_.communicator.label_next("step loss, norm, overflow");
  all_reduce_host(context_, totals.values, totals.values, 3, DType::kFloat32, Reduction::kSum);
  if (tensor != nullptr) {
    // Each tensor-parallel rank summed its own slices (and the first, the replicated
    // parameters); the loss is the same on every one of them, so only the norm and the
    // overflow flag are summed across the group.
    tensor->label_next("step norm, overflow across the tensor-parallel group");
    all_reduce_host(context_, *tensor, totals.values + 1, totals.values + 1, 2, DType::kFloat32,
                    Reduction::kSum);
  }
  return finish_step(lr, totals);
}

ZeroTrainer::StepTotals ZeroTrainer::step_totals(double loss) {
  context_.comm.synchronize();
  // At stage 0 every rank holds the same full gradients, so each contributes a world-th of the
  // norm; with hybrid sharding each shard is held by every replica, so each contributes a
  // replicas-th (engine/hybrid_shards.h; stage 0 has no replicas).
  const int world = context_.world_size;
  const int replicas = context_.replicas;
  checks_->inspect(units_, plan_, counted_);
  const bool non_finite = checks_->any_non_finite();
  const double square_sum = checks_->local_sum_of_squares();
  StepTotals totals;
  totals.values[0] = static_cast<float>(loss);
  totals.values[1] =
      static_cast<float>(plan_.optimizer_sharded ? square_sum / replicas : square_sum / world);
  totals.values[2] = non_finite ? 1.0f : 0.0f;
  return totals;
}

bool ZeroTrainer::diverges(const StepTotals& summed) const {
  return overflowed(summed) && !options_.loss_scale.enabled;
}

StepStats ZeroTrainer::finish_step(float lr, const StepTotals& summed) {
  wait_for_state_readers();  // before the update rewrites what a snapshot may still be reading
  const float* totals = summed.values;
  StepStats stats;
  stats.loss_scale = scaler_.scale();
  stats.loss = totals[0];  // units report the unscaled loss
  stats.lr = lr >= 0.0f ? lr : optimizer_->options().lr;
  micro_batches_ = 0;
  loss_sum_ = 0.0;
  stats.step = ++steps_taken_;
  if (diverges(summed)) {
    // The flag was summed over every rank the step's all-reduce spans, and the tensor-parallel
    // group: the report is gathered over the same ranks.
    std::vector<Communicator*> groups = context_.communicator.spanning_groups();
    groups.push_back(module_.tensor_parallel_group());
    raise_divergence(context_, groups, stats.step, options_.compute_dtype, non_finite_finding());
  }
  const bool overflow = overflowed(summed);
  // The per-unit checks start again from zero for the next step's reductions (compute order).
  checks_->reset();
  if (options_.loss_scale.enabled && overflow) {
    // Every rank saw the same flag, so every rank skips: nothing is updated or gathered.
    stats.skipped = true;
    stats.grad_norm = std::nanf("");
    zero_gradients();
    scaler_.update(true);
    return stats;
  }
  scaler_.update(false);
  stats.grad_norm = std::sqrt(totals[1]) / stats.loss_scale;
  float grad_scale = 1.0f / stats.loss_scale;
  if (options_.gradient_clipping > 0.0f && stats.grad_norm > options_.gradient_clipping) {
    // torch.nn.utils.clip_grad_norm_'s rule: scale by max_norm / (norm + 1e-6).
    grad_scale *= options_.gradient_clipping / (stats.grad_norm + 1e-6f);
  }
  apply_optimizer(stats.lr, grad_scale);
  // Offloaded, each unit went back to the device (and was gathered) as the host updated it.
  gatherer_->step_done(units_, offloaded());
  return stats;
}

void ZeroTrainer::apply_optimizer(float lr, float grad_scale) {
  UpdateArgs args;
  args.lr = lr;
  args.step = ++optimizer_steps_;
  args.grad_scale = grad_scale;
  auto begin = trace_begin();
  for (FlatUnit& unit : units_) update_unit(unit, args);
  trace_end(begin, "optimizer");
  zero_gradients();
}

void ZeroTrainer::update_unit(FlatUnit& unit, const UpdateArgs& shared_args) {
  if (host_) {
    host_->update(unit, *optimizer_, shared_args);
    gatherer_->shard_updated(unit);
    return;
  }
  Stream& compute = context_.compute;
  const DType held = options_.compute_dtype;
  const bool two_byte = held != DType::kFloat32;
  // Offsets are in the unit's flat coordinates; buffers that hold only the shard start at the
  // shard's first element.
  const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
  const std::size_t params_base = plan_.params_first(shard_begin);
  const std::size_t grads_base = plan_.grads_first(shard_begin);
  const std::size_t state_base = plan_.optimizer_first(shard_begin);
  Buffer widened;  // 2-byte gradients widened to fp32 for the optimizer
  if (two_byte) {
    const std::size_t length =
        plan_.optimizer_length(unit.layout.flat_length(), unit.layout.shard_length());
    widened = context_.allocator().allocate(length * sizeof(float), Category::kWorkspace);
  }
  // offload_param: the optimizer updates a device copy of the host's shard, written back after.
  // In 2-byte compute the update writes every parameter from the master: nothing to read.
  StagedShard staged(context_, options_, unit, compute, swapped_params_.get(), !two_byte);
  for (const FlatUnit::UpdateRange& range : unit.update_ranges) {
    UpdateArgs args = shared_args;
    args.decay = range.decay;
    std::vector<float*> state;
    for (Buffer& buffer : unit.optimizer_state) {
      state.push_back(buffer.as<float>() + (range.flat_offset - state_base));
    }
    const void* grads = byte_offset(unit.grads.data(), (range.flat_offset - grads_base) * dtype_size(held));
    void* params = const_cast<char*>(byte_offset(staged.data(), (range.flat_offset - params_base) * dtype_size(held)));
    if (!two_byte) {
      optimizer_->update(compute, static_cast<float*>(params), static_cast<const float*>(grads),
                         state, range.count, args);
      continue;
    }
    // 2-byte compute: update the fp32 master and round it to the compute dtype (in the same
    // pass where the optimizer can).
    float* master = unit.master.as<float>() + (range.flat_offset - state_base);
    float* wide_grads = widened.as<float>() + (range.flat_offset - state_base);
    convert(compute, grads, held, wide_grads, DType::kFloat32, range.count);
    optimizer_->update_and_round(compute, master, wide_grads, state, range.count, args, params,
                                 held);
  }
  staged.write_back();
  release_on(compute, std::move(widened));
}

void ZeroTrainer::zero_gradients() {
  for (FlatUnit& unit : units_) {
    context_.device.fill_zero(context_.compute, unit.grads.data(), unit.grads.bytes());
  }
}

}  // namespace zest
