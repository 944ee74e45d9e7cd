#include "engine/zero_trainer.h"

#include <algorithm>

#include "base/error.h"
#include "kernels/convert.h"
#include "kernels/matmul.h"
#include "engine/device_batch.h"
#include "engine/model_state.h"
#include "engine/parameter_init.h"
#include "engine/parameter_offload.h"
#include "engine/quantized_collectives.h"
#include "runtime/host_collectives.h"
#include "runtime/host_copies.h"
#include "runtime/release_after.h"
#include "runtime/shape_device.h"

namespace zest {

// What a unit sees during one forward or backward call. Short-lived: built per call, never
// captured by enqueued work.
class ZeroTrainer::Context final : public UnitContext {
 public:
  Context(ZeroTrainer& trainer, FlatUnit& unit, const Batch& batch, MicroBatchPass& pass,
          CallViews& views, CallKind kind)
      : trainer_(trainer), unit_(unit), batch_(batch), pass_(pass), views_(views), kind_(kind) {}

  Stream& stream() override { return trainer_.context_.compute; }
  Device& device() override { return trainer_.context_.device; }
  const Batch& batch() override { return batch_; }

  Tensor param(std::size_t index) override {
    if (!views_.params) refuse("param() in a backward that backward_reads_parameters() denies");
    return view(unit_, views_.params, index);
  }
  Tensor grad(std::size_t index) override {
    if (!views_.backward) refuse("grad() is for backward");
    if (!views_.grads) views_.grads = trainer_.gradient_view(unit_, views_);
    return view(unit_, views_.grads, index);
  }
  Tensor borrowed_param(std::size_t borrowed, std::size_t index) override {
    trainer_.borrowed_->pin(unit_, views_.borrowed, borrowed);
    return view(trainer_.units_.at(unit_.borrowed.at(borrowed)), views_.borrowed.params.at(borrowed),
                index);
  }
  Tensor borrowed_grad(std::size_t borrowed, std::size_t index) override {
    if (!views_.backward) refuse("borrowed_grad() is for backward");
    trainer_.borrowed_->pin(unit_, views_.borrowed, borrowed);
    FlatUnit& lender = trainer_.units_.at(unit_.borrowed.at(borrowed));
    float*& grads = views_.borrowed.grads.at(borrowed);
    if (!grads) grads = trainer_.gradient_view(lender, views_);
    return view(lender, grads, index);
  }
  void unpin_borrowed(std::size_t borrowed) override {
    if (borrowed >= unit_.borrowed.size()) refuse("unpin_borrowed() of a unit it does not borrow");
    trainer_.borrowed_->unpin(unit_, views_.borrowed, borrowed);
  }

  Tensor input() override {
    if (static_cast<std::size_t>(unit_.index) == pass_.first_computing_) return batch_.inputs;
    return pass_.activations_[unit_.index - 1].output_view;
  }
  Tensor make_output(const std::vector<std::int64_t>& shape, DType dtype) override {
    MicroBatchPass::UnitActivations& mine = pass_.activations_[unit_.index];
    if (kind_ != CallKind::kRecompute) return make(mine.output, mine.output_view, shape, dtype);
    // Note: the recomputed forward writes its output over the one it made in the first pass,
    // which the next unit's backward has read already and which stays until this unit's
    // backward: forward is deterministic, so the bytes are the same, and no memory is taken.
    if (mine.output_view.shape != shape || mine.output_view.dtype != dtype ||
        !mine.output_view.data) {
      refuse("its recomputed forward made an output of another shape than its first forward");
    }
    return mine.output_view;
  }
  float* loss() override { return trainer_.loss_buffer_.as<float>(); }
  bool backward_follows() override { return !pass_.evaluating_ && kind_ != CallKind::kCheckpoint; }
  bool recompute_selectively() override {
    return trainer_.recompute_of(static_cast<std::size_t>(unit_.index), pass_) ==
           RecomputePolicy::kSelective;
  }

  Tensor grad_output() override {
    // The last unit gets the gradient made outside the trainer (a later pipeline stage's).
    if (unit_.index + 1 == static_cast<int>(trainer_.units_.size())) return pass_.grad_output_;
    return pass_.activations_[unit_.index + 1].grad_input_view;
  }
  Tensor make_grad_input(const std::vector<std::int64_t>& shape, DType dtype) override {
    MicroBatchPass::UnitActivations& mine = pass_.activations_[unit_.index];
    return make(mine.grad_input, mine.grad_input_view, shape, dtype);
  }
  float loss_scale() override {
    return trainer_.scaler_.scale() / static_cast<float>(trainer_.options_.gradient_accumulation_steps);
  }

  Buffer allocate(std::size_t bytes, Category category) override {
    return trainer_.context_.allocator().allocate(bytes, category);
  }
  void release(Buffer buffer) override { trainer_.release_on(stream(), std::move(buffer)); }

 private:
  [[noreturn]] void refuse(const std::string& why) const {
    throw Error(ErrorKind::kUsage, "unit '" + unit_.layout.unit_name() + "': " + why);
  }
  static Tensor view(const FlatUnit& unit, float* base, std::size_t index) {
    const ParamPlace& place = unit.layout.params().at(index);
    return Tensor{base + place.offset, place.shape, DType::kFloat32};
  }
  Tensor make(Buffer& buffer, Tensor& view, const std::vector<std::int64_t>& shape, DType dtype) {
    Tensor tensor{nullptr, shape, dtype};
    buffer = trainer_.context_.allocator().allocate(tensor.bytes(), Category::kActivations);
    tensor.data = buffer.data();
    view = tensor;
    return tensor;
  }

  ZeroTrainer& trainer_;
  FlatUnit& unit_;
  const Batch& batch_;
  MicroBatchPass& pass_;
  CallViews& views_;
  const CallKind kind_;
};

ZeroTrainer::ZeroTrainer(RankContext& context, const EngineOptions& options, Module& module,
                         std::unique_ptr<Optimizer> optimizer)
    : context_(context), module_(module), options_(options), plan_(StagePlan::of(options.stage)),
      optimizer_(std::move(optimizer)), scaler_(options.loss_scale) {
  if (options_.gradient_accumulation_steps < 1) {
    throw Error(ErrorKind::kConfig, "gradient_accumulation_steps: must be >= 1");
  }
  if (options_.loss_scale.enabled && options_.compute_dtype != DType::kFloat16) {
    throw Error(ErrorKind::kConfig, "fp16: loss scaling applies to fp16 training only");
  }
  if (options_.offload_optimizer.enabled() && !plan_.can_offload_optimizer()) {
    throw Error(ErrorKind::kConfig, "zero_optimization.offload_optimizer.device: \"cpu\" " +
                                        plan_.refusal(StageFeature::kOffloadOptimizer) +
                                        "; raise the stage or set \"none\"");
  }
  check_quantized_collectives(options_);
  check_parameter_offload(options_);
  // Note: 2-byte training multiplies in its own type where the device can (CUDA's tensor
  // cores take the units' fp32 views rounded to it, as autocast does); fp32 training exactly.
  set_fp32_matmul_rounding(context.compute, options_.compute_dtype);
  std::vector<Unit*> units = module.units();
  if (units.empty()) throw Error(ErrorKind::kUsage, "the module has no units");
  for (std::size_t i = 0; i < units.size(); ++i) {
    units_.push_back(plan_flat_unit(*units[i], static_cast<int>(i), plan_, context.rank,
                                    context.world_size, options_.shard_alignment));
    for (int borrowed : units_.back().borrowed) {
      if (borrowed < 0 || borrowed >= static_cast<int>(i)) {
        throw Error(ErrorKind::kUsage, "unit '" + units[i]->name() + "' borrows unit " +
                                           std::to_string(borrowed) +
                                           "; a unit may only borrow an earlier unit");
      }
    }
    layouts_.push_back(units_.back().layout);
  }
  for (std::size_t u = 0; u < units_.size(); ++u) counted_.push_back(!module.holds_copy(u));
  while (first_computing_ < units_.size() && !counted_[first_computing_]) ++first_computing_;
  if (first_computing_ == units_.size()) {
    throw Error(ErrorKind::kUsage, "the module holds only lent copies: no unit to run");
  }
  pass_ = make_pass(units);
  recompute_ = given_or_planned(options_.activation_checkpointing, options_.recompute_plan, units);
  bound_recompute_lag_ = context_.device.kind() != DeviceKind::kCuda;
  input_offloaded_.assign(units_.size(), false);
  if (options_.activation_checkpointing.cpu_checkpointing) {
    if (!options_.activation_checkpointing.enabled()) {
      throw Error(ErrorKind::kConfig,
                  "activation_checkpointing.cpu_checkpointing: true needs "
                  "activation_checkpointing.policy \"full\" or \"selective\": only a recomputed "
                  "unit's input is a checkpoint to offload");
    }
    for (std::size_t u = 1; u < units_.size(); ++u) {
      input_offloaded_[u] = recompute_[u] != RecomputePolicy::kNone;
    }
    checkpoints_ = std::make_unique<CheckpointOffload>(context_, units_.size());
  }
  for (std::size_t i = 0; i < kRecomputeLag; ++i) {
    lag_events_.push_back(context_.device.create_event());
  }
  if (options_.offload_param.device == OffloadDevice::kNvme) {
    swapped_params_ = std::make_unique<SwappedParameters>(context_, options_);
  }
  gatherer_ = std::make_unique<ParameterGatherer>(context_, options_, plan_, units_.size());
  borrowed_ = std::make_unique<BorrowedUnits>(context_, options_.compute_dtype, units_, *gatherer_);
  if (options_.offload_optimizer.enabled()) {
    host_ = std::make_unique<HostOptimizer>(context_, options_, plan_, units_.size(),
                                            swapped_params_.get());
  }
  try {
    allocate_model_state();
    if (host_) host_->allocate(units_, optimizer_->state_count());
    // Note: the shape-only device backs no memory to write the values to, and drawing them is
    // most of the plan's time at a billion parameters.
    if (runs_work(context_.device)) initialize_parameters();
    context_.synchronize();
  } catch (...) {
    // Note: a constructor that throws runs no destructor, so the zero fills enqueued so far
    // must finish before the members' buffers are freed (an out-of-memory midway, say).
    try {
      context_.synchronize();
    } catch (...) {
      // The first failure is the one rethrown.
    }
    throw;
  }
}

ZeroTrainer::~ZeroTrainer() {
  // Enqueued work may still use the buffers this object owns.
  wait_for_state_readers();
  try {
    context_.synchronize();
    if (checkpoints_) checkpoints_->synchronize();
    if (host_) host_->synchronize();
  } catch (...) {
    // Whoever synchronizes next reports the failure; a destructor must not throw.
  }
}

void ZeroTrainer::allocate_state() {
  Allocator& allocator = context_.allocator();
  const bool two_byte = options_.compute_dtype != DType::kFloat32;
  if (swapped_params_) swapped_params_->allocate(units_);
  for (FlatUnit& unit : units_) {
    const std::size_t full = unit.layout.flat_length();
    const std::size_t shard = unit.layout.shard_length();
    const std::size_t optimizer_length = plan_.optimizer_length(full, shard) * sizeof(float);
    if (!swapped_params_ || !swapped_params_->holds(unit)) {
      unit.params = parameter_allocator(context_, options_)
                        .allocate(plan_.params_length(full, shard) * element_size(), Category::kParams);
    }
    unit.grads =
        allocator.allocate(plan_.grads_length(full, shard) * element_size(), Category::kGrads);
    // Offloaded, the master and the states live in the host arena (HostOptimizer::allocate).
    const std::size_t device_states = offloaded() ? 0 : optimizer_->state_count();
    if (two_byte && !offloaded()) {
      unit.master = allocator.allocate(optimizer_length, Category::kOptimizer);
    }
    for (std::size_t s = 0; s < device_states; ++s) {
      unit.optimizer_state.push_back(allocator.allocate(optimizer_length, Category::kOptimizer));
      context_.device.fill_zero(context_.compute, unit.optimizer_state.back().data(),
                                unit.optimizer_state.back().bytes());
    }
    context_.device.fill_zero(context_.compute, unit.grads.data(), unit.grads.bytes());
  }
  gatherer_->allocate_ring(units_, shard_fetch(context_, options_, swapped_params_.get()));
  loss_buffer_ = allocator.allocate(sizeof(float), Category::kWorkspace);
  checks_ = std::make_unique<GradientChecks>(context_, options_.compute_dtype, units_.size());
  GradientReducer::FinalShard final_shard;
  if (host_) final_shard = [host = host_.get()](FlatUnit& unit) { host->copy_gradients_to_host(unit); };
  reducer_ = std::make_unique<GradientReducer>(context_, options_, plan_, units_, *checks_, *gatherer_,
                                               std::move(final_shard));
}

void ZeroTrainer::allocate_model_state() {
  try {
    allocate_state();
  } catch (const OutOfMemory& error) {
    // The allocator knows the bytes it was asked for; the engine knows what the whole model
    // state needs and what would fit, which is what the user must change.
    throw OutOfMemory(std::string(error.what()) + "; " +
                      model_state_advice(model_state_shape(), plan_.stage, context_.world_size,
                                         context_.allocator().capacity(), offloaded()));
  }
}

void ZeroTrainer::initialize_parameters() {
  for (FlatUnit& unit : units_) {
    const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
    // At stage 3 this rank holds only its shard, so it draws only the shard's elements: the
    // draw of an element depends on (seed, unit, parameter, element), never on the rank.
    const std::size_t first = plan_.params_first(shard_begin);
    const std::size_t length =
        plan_.params_length(unit.layout.flat_length(), unit.layout.shard_length());
    std::vector<float> values(length, 0.0f);
    for (std::size_t p = 0; p < unit.specs.size(); ++p) {
      const ParamPlace& place = unit.layout.params()[p];
      const std::size_t begin = std::max(place.offset, first);
      const std::size_t end = std::min(place.offset + place.numel, first + length);
      if (begin >= end) continue;
      const ParamSpec& spec = unit.specs[p];
      if (spec.draw_slice.enabled()) {
        fill_slice_initial_values(
            spec.init, spec.draw_slice, spec.shape, options_.seed,
            module_.initialization_index(static_cast<std::size_t>(unit.index)), p,
            begin - place.offset, end - begin, values.data() + (begin - first));
        continue;
      }
      const bool redrawn = spec.draw_unit >= 0;
      fill_initial_values(
          spec.init, options_.seed,
          redrawn ? spec.draw_unit
                  : module_.initialization_index(static_cast<std::size_t>(unit.index)),
          redrawn ? static_cast<std::size_t>(spec.draw_param) : p,
          static_cast<std::size_t>(redrawn ? spec.draw_first : 0) + (begin - place.offset),
          end - begin, values.data() + (begin - first));
    }
    // Drawn on the host, written in compute-stream order (a copy to the device on CUDA).
    std::vector<unsigned char> params(length * element_size());
    cpu::convert(values.data(), DType::kFloat32, params.data(), options_.compute_dtype, length);
    if (swapped_params_ && swapped_params_->holds(unit)) {
      swapped_params_->write(unit, 0, length, params.data());  // blocking, before any step
    } else {
      write_from_host(context_.device, context_.compute, unit.params.data(), params.data(),
                      params.size());
    }
    // The master starts from the fp32 draw itself, not from its 2-byte rounding, so every
    // stage starts from the same master weights.
    initialize_master(unit, values.data() + (plan_.optimizer_first(shard_begin) - first));
  }
}

float* ZeroTrainer::fp32_params(void* params, std::size_t count, CallViews& views) {
  if (options_.compute_dtype == DType::kFloat32) return static_cast<float*>(params);
  // Note: the CPU device computes in fp32, so a 2-byte unit is widened into a workspace copy for
  // the call; a device with 2-byte kernels would hand the unit its buffer directly.
  Buffer copy = context_.allocator().allocate(count * sizeof(float), Category::kWorkspace);
  convert(context_.compute, params, options_.compute_dtype, copy.data(), DType::kFloat32, count);
  float* view = copy.as<float>();
  views.scratch.push_back(std::move(copy));
  return view;
}

float* ZeroTrainer::fp32_grads(void* target, std::size_t count, CallViews& views) {
  if (options_.compute_dtype == DType::kFloat32) return static_cast<float*>(target);
  Buffer accumulator = context_.allocator().allocate(count * sizeof(float), Category::kWorkspace);
  context_.device.fill_zero(context_.compute, accumulator.data(), accumulator.bytes());
  float* view = accumulator.as<float>();
  views.folds.push_back({target, view, count});
  views.scratch.push_back(std::move(accumulator));
  return view;
}

float* ZeroTrainer::gradient_view(FlatUnit& unit, CallViews& views) {
  return fp32_grads(reducer_->target(unit), unit.layout.flat_length(), views);
}

bool ZeroTrainer::pins_own(const FlatUnit& unit, bool backward, bool recomputed) const {
  return !backward || recomputed || unit.backward_reads_parameters ||
         gatherer_->gradient_in_slot(unit);
}

ZeroTrainer::CallViews::~CallViews() {
  for (Buffer& buffer : scratch) {
    if (buffer.empty()) continue;
    try {
      release_after(*device, *stream, std::move(buffer));
    } catch (...) {
      // Only the device can fail a stream-ordered free; its stream's next synchronize says so.
    }
  }
}

ZeroTrainer::CallViews ZeroTrainer::prepare_call(FlatUnit& unit, const MicroBatchPass& pass,
                                                 bool backward, bool recomputed) {
  // Pinned first, so that at stage 3 the unit's gathers are enqueued before the host waits for
  // a lagging recomputed call: they overlap that call's compute.
  const bool pin_own = pins_own(unit, backward, recomputed);
  void* params = pin_own ? gatherer_->pin(unit) : nullptr;
  const std::vector<void*> borrowed_params = borrowed_->pin_at_once(unit);
  if (recomputed) wait_for_lagging_call(pass);
  CallViews views;
  views.device = &context_.device;
  views.stream = &context_.compute;
  views.backward = backward;
  // Note: a gradient that lives in its unit's gather slot is made when the unit first asks for
  // it (Context::grad), after the unit's last read of those parameters; every other gradient
  // target is made here, before the call, as the memory planner replays it.
  auto eager_gradient = [&](FlatUnit& owner) {
    return backward && !gatherer_->gradient_in_slot(owner) ? gradient_view(owner, views) : nullptr;
  };
  views.own_pinned = pin_own;
  if (pin_own) views.params = fp32_params(params, unit.layout.flat_length(), views);
  views.grads = eager_gradient(unit);
  if (borrowed_->begin(unit, views.borrowed)) return views;  // in turn: pinned at first ask
  for (std::size_t i = 0; i < unit.borrowed.size(); ++i) {
    FlatUnit& lender = units_[unit.borrowed[i]];
    views.borrowed.params.push_back(
        fp32_params(borrowed_params[i], lender.layout.flat_length(), views));
    views.borrowed.grads.push_back(eager_gradient(lender));
  }
  return views;
}

void ZeroTrainer::finish_call(FlatUnit& unit, CallViews& views) {
  for (const CallViews::Fold& fold : views.folds) {
    accumulate_into(context_.compute, fold.target, options_.compute_dtype, fold.source,
                    DType::kFloat32, fold.count);
  }
  for (Buffer& buffer : views.scratch) release_on(context_.compute, std::move(buffer));
  borrowed_->unpin_all(unit, views.borrowed);
  if (views.own_pinned) gatherer_->unpin(unit);
}

void ZeroTrainer::call_unit(FlatUnit& unit, const Batch& batch, MicroBatchPass& pass,
                            CallViews& views, void (Unit::*method)(UnitContext&),
                            const std::string& slice, CallKind kind) {
  Context context(*this, unit, batch, pass, views, kind);
  auto begin = trace_begin();
  (pass.units_[static_cast<std::size_t>(unit.index)]->*method)(context);
  trace_end(begin, slice);
}

std::shared_ptr<std::int64_t> ZeroTrainer::trace_begin() {
  if (!context_.trace) return nullptr;
  auto begin = std::make_shared<std::int64_t>(0);
  context_.compute.enqueue([begin] { *begin = TraceRecorder::now_us(); });
  return begin;
}

void ZeroTrainer::trace_end(const std::shared_ptr<std::int64_t>& begin, std::string name) {
  if (!begin) return;
  context_.compute.enqueue([begin, trace = context_.trace, rank = context_.rank_in_world(),
                            name = std::move(name)] {
    trace->add({rank, "compute", name, *begin, TraceRecorder::now_us(), -1});
  });
}

// Frees after the stream's queued uses, in stream order (runtime/release_after.h says how).
void ZeroTrainer::release_on(Stream& stream, Buffer buffer) {
  release_after(context_.device, stream, std::move(buffer));
}

float ZeroTrainer::forward_backward(const Batch& batch) {
  if (micro_batches_ == options_.gradient_accumulation_steps) {
    throw Error(ErrorKind::kUsage,
                "forward_backward called more than gradient_accumulation_steps (" +
                    std::to_string(options_.gradient_accumulation_steps) +
                    ") times since the last step(); call step()");
  }
  if (micro_batches_ == 0) {
    // The step this micro-batch belongs to, for the errors of the collectives issued from now.
    context_.communicator.begin_step(steps_taken_ + 1);
    inject_step_fault();
  }
  ++micro_batches_;
  const bool last_micro_batch = micro_batches_ == options_.gradient_accumulation_steps;
  pass_.recomputed_calls_ = 0;
  try {
    const DeviceBatch staged(context_.device, context_.compute, batch);
    run_forward(staged.batch(), pass_);
    run_backward(staged.batch(), pass_, last_micro_batch);
  } catch (const OutOfMemory& error) {
    const std::string advice = training_memory_advice(batch);
    if (advice.empty()) throw;
    throw OutOfMemory(std::string(error.what()) + "; " + advice);
  }
  // Note: reading the loss needs the compute stream to finish this micro-batch; the comm stream
  // goes on reducing gradients meanwhile.
  float loss = 0.0f;
  read_to_host(context_.device, context_.compute, &loss, loss_buffer_.data(), sizeof loss);
  loss_sum_ += loss;
  return loss;
}

float ZeroTrainer::evaluate(const Batch& batch) {
  if (micro_batches_ != 0) {
    throw Error(ErrorKind::kUsage, "evaluate() between micro-batches; evaluate between steps");
  }
  pass_.evaluating_ = true;
  try {
    const DeviceBatch staged(context_.device, context_.compute, batch);
    run_forward(staged.batch(), pass_);
  } catch (...) {
    pass_.evaluating_ = false;
    throw;
  }
  pass_.evaluating_ = false;
  // Nothing waits for a backward: the outputs go as soon as the forward is done with them.
  release_pass(pass_);
  float loss = 0.0f;
  read_to_host(context_.device, context_.compute, &loss, loss_buffer_.data(), sizeof loss);
  loss /= static_cast<float>(context_.world_size * context_.replicas);
  context_.communicator.label_next("evaluation loss");
  all_reduce_host(context_, &loss, &loss, 1, DType::kFloat32, Reduction::kSum);
  return loss;
}

ModelStateShape ZeroTrainer::model_state_shape() const {
  ModelStateShape shape;
  shape.compute_dtype = options_.compute_dtype;
  shape.optimizer_states = optimizer_->state_count();
  shape.alignment = options_.shard_alignment;
  for (const FlatUnit& unit : units_) {
    UnitShapes shapes{unit.layout.unit_name(), {}, unit.borrowed,
                      unit.gradients_replace_parameters, unit.borrows_in_turn,
                      unit.backward_reads_parameters};
    for (const ParamPlace& place : unit.layout.params()) shapes.params.push_back({place.name, place.shape});
    shape.units.push_back(std::move(shapes));
  }
  return shape;
}

Engine::Engine(RankContext& context, EngineOptions options)
    : context_(context), options_(std::move(options)) {}

std::unique_ptr<Trainer> Engine::shard(Module& module, std::unique_ptr<Optimizer> optimizer) {
  if (!optimizer) throw Error(ErrorKind::kUsage, "Engine::shard needs an optimizer");
  if (options_.outer_loop.enabled()) return shard_in_groups(module, std::move(optimizer));
  return std::make_unique<ZeroTrainer>(trainer_context(module), options_, module,
                                       std::move(optimizer));
}

}  // namespace zest
