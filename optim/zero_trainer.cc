#include "optim/zero_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "kernels/vector_ops.h"
#include "optim/parameter_init.h"

namespace zest {

// What a unit sees during one forward or backward call. Short-lived: built per call, never
// captured by enqueued work.
class ZeroTrainer::Context final : public UnitContext {
 public:
  Context(ZeroTrainer& trainer, FlatUnit& unit, const Batch& batch, float* params,
          float* grads, std::vector<float*> borrowed_params, std::vector<float*> borrowed_grads)
      : trainer_(trainer),
        unit_(unit),
        batch_(batch),
        params_(params),
        grads_(grads),
        borrowed_params_(std::move(borrowed_params)),
        borrowed_grads_(std::move(borrowed_grads)) {}

  Stream& stream() override { return trainer_.context_.compute; }
  Device& device() override { return trainer_.context_.device; }
  const Batch& batch() override { return batch_; }

  Tensor param(std::size_t index) override { return view(unit_, params_, index); }
  Tensor grad(std::size_t index) override {
    if (!grads_) throw Error(ErrorKind::kUsage, "unit '" + unit_.layout.unit_name() + "': grad() is for backward");
    return view(unit_, grads_, index);
  }
  Tensor borrowed_param(std::size_t borrowed, std::size_t index) override {
    return view(trainer_.units_.at(unit_.borrowed.at(borrowed)), borrowed_params_.at(borrowed), index);
  }
  Tensor borrowed_grad(std::size_t borrowed, std::size_t index) override {
    if (borrowed_grads_.empty()) {
      throw Error(ErrorKind::kUsage, "unit '" + unit_.layout.unit_name() + "': borrowed_grad() is for backward");
    }
    return view(trainer_.units_.at(unit_.borrowed.at(borrowed)), borrowed_grads_.at(borrowed), index);
  }

  Tensor input() override {
    if (unit_.index == 0) return batch_.inputs;
    return trainer_.activations_[unit_.index - 1].output_view;
  }
  Tensor make_output(const std::vector<std::int64_t>& shape, DType dtype) override {
    return make(trainer_.activations_[unit_.index].output,
                trainer_.activations_[unit_.index].output_view, shape, dtype);
  }
  float* loss() override { return trainer_.loss_buffer_.as<float>(); }

  Tensor grad_output() override {
    if (unit_.index + 1 == static_cast<int>(trainer_.units_.size())) return {};
    return trainer_.activations_[unit_.index + 1].grad_input_view;
  }
  Tensor make_grad_input(const std::vector<std::int64_t>& shape, DType dtype) override {
    return make(trainer_.activations_[unit_.index].grad_input,
                trainer_.activations_[unit_.index].grad_input_view, shape, dtype);
  }
  float loss_scale() override {
    return 1.0f / static_cast<float>(trainer_.options_.gradient_accumulation_steps);
  }

  Buffer allocate(std::size_t bytes, Category category) override {
    return trainer_.context_.allocator().allocate(bytes, category);
  }
  void release(Buffer buffer) override { trainer_.release_on(stream(), std::move(buffer)); }

 private:
  static Tensor view(const FlatUnit& unit, float* base, std::size_t index) {
    const ParamSlot& slot = unit.layout.params().at(index);
    return Tensor{base + slot.offset, slot.shape, DType::kFloat32};
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
  float* params_;
  float* grads_;
  std::vector<float*> borrowed_params_;
  std::vector<float*> borrowed_grads_;
};

ZeroTrainer::ZeroTrainer(RankContext& context, const EngineOptions& options, Module& module,
                         std::unique_ptr<Optimizer> optimizer)
    : context_(context), options_(options), optimizer_(std::move(optimizer)) {
  if (options_.stage < 0 || options_.stage > 3) {
    throw Error(ErrorKind::kConfig, "zero_optimization.stage: must be 0, 1, 2 or 3, got " +
                                        std::to_string(options_.stage));
  }
  if (options_.gradient_accumulation_steps < 1) {
    throw Error(ErrorKind::kConfig, "gradient_accumulation_steps: must be >= 1");
  }
  std::vector<Unit*> units = module.units();
  if (units.empty()) throw Error(ErrorKind::kUsage, "the module has no units");
  for (std::size_t i = 0; i < units.size(); ++i) {
    units_.push_back(plan_flat_unit(*units[i], static_cast<int>(i), options_.stage, context.rank,
                                    context.world_size, options_.shard_alignment));
    for (int borrowed : units_.back().borrowed) {
      if (borrowed < 0 || borrowed >= static_cast<int>(i)) {
        throw Error(ErrorKind::kUsage, "unit '" + units[i]->name() +
                                           "' borrows unit " + std::to_string(borrowed) +
                                           "; a unit may only borrow an earlier unit");
      }
    }
    layouts_.push_back(units_.back().layout);
  }
  activations_.resize(units_.size());
  for (std::size_t i = 0; i < units_.size(); ++i) {
    backward_done_.push_back(context.device.create_event());
    bucket_released_.push_back(context.device.create_event());
  }
  optimizer_done_ = context.device.create_event();
  parameters_ready_ = context.device.create_event();
  allocate_state();
  initialize_parameters();
  context_.synchronize();
}

ZeroTrainer::~ZeroTrainer() {
  // Enqueued work may still use the buffers this object owns.
  try {
    context_.synchronize();
  } catch (...) {
    // The failure was or will be reported by whoever synchronizes next; a destructor must not throw.
  }
}

void ZeroTrainer::allocate_state() {
  Allocator& allocator = context_.allocator();
  const int stage = options_.stage;
  std::size_t largest_unit = 0;
  std::size_t most_borrowed = 0;
  for (FlatUnit& unit : units_) {
    const std::size_t full = unit.layout.flat_length() * sizeof(float);
    const std::size_t shard = unit.layout.shard_length() * sizeof(float);
    unit.params = allocator.allocate(stage == 3 ? shard : full, Category::kParams);
    unit.grads = allocator.allocate(stage >= 2 ? shard : full, Category::kGrads);
    for (std::size_t s = 0; s < optimizer_->state_count(); ++s) {
      unit.optimizer_state.push_back(
          allocator.allocate(stage == 0 ? full : shard, Category::kOptimizer));
      context_.device.fill_zero(context_.compute, unit.optimizer_state.back().data(),
                                unit.optimizer_state.back().bytes());
    }
    context_.device.fill_zero(context_.compute, unit.grads.data(), unit.grads.bytes());
    largest_unit = std::max(largest_unit, unit.layout.flat_length());
    most_borrowed = std::max(most_borrowed, unit.borrowed.size());
  }
  if (stage == 3) {
    // One set of units computing plus one set being gathered ahead.
    const std::size_t slots = std::max(options_.gather_slots, 2 * (1 + most_borrowed));
    ring_ = std::make_unique<GatherRing>(context_.device, largest_unit, slots);
  }
  loss_buffer_ = allocator.allocate(sizeof(float), Category::kWorkspace);
}

void ZeroTrainer::initialize_parameters() {
  for (FlatUnit& unit : units_) {
    float* params = unit.params.as<float>();
    const std::size_t length = unit.params.bytes() / sizeof(float);
    // At stage 3 this rank holds only its shard, so it draws only the shard's elements: the
    // draw of an element depends on (seed, unit, parameter, element), never on the rank.
    const std::size_t first = options_.stage == 3 ? unit.layout.shard_range(context_.rank).begin : 0;
    std::fill(params, params + length, 0.0f);
    for (std::size_t p = 0; p < unit.specs.size(); ++p) {
      const ParamSlot& slot = unit.layout.params()[p];
      const std::size_t begin = std::max(slot.offset, first);
      const std::size_t end = std::min(slot.offset + slot.numel, first + length);
      if (begin >= end) continue;
      fill_initial_values(unit.specs[p].init, options_.seed, unit.index, p, begin - slot.offset,
                          end - begin, params + (begin - first));
    }
  }
}

float* ZeroTrainer::acquire_params(FlatUnit& unit) {
  if (ring_) return ring_->acquire(unit, context_.comm, context_.compute, context_.communicator);
  return unit.params.as<float>();
}

void ZeroTrainer::release_params(FlatUnit& unit) {
  if (ring_) ring_->release(unit, context_.compute);
}

float* ZeroTrainer::gradient_target(FlatUnit& unit) {
  if (options_.stage < 2) return unit.grads.as<float>();
  if (unit.bucket.empty()) {
    // Note: at most kLiveBuckets buckets exist at once: one being written by backward and one
    // being reduced meanwhile. Without the bound, a host that runs ahead of the comm stream would
    // hold every unit's full gradients at once, which is what stage 2 exists to avoid.
    while (buckets_in_flight_.size() >= kLiveBuckets) {
      bucket_released_[buckets_in_flight_.front()]->synchronize();
      buckets_in_flight_.pop_front();
    }
    unit.bucket = context_.allocator().allocate(unit.layout.flat_length() * sizeof(float),
                                                Category::kBuckets);
    context_.device.fill_zero(context_.compute, unit.bucket.data(), unit.bucket.bytes());
  }
  return unit.bucket.as<float>();
}

void ZeroTrainer::release_on(Stream& stream, Buffer buffer) {
  if (buffer.empty()) return;
  auto owned = std::make_shared<Buffer>(std::move(buffer));
  stream.enqueue([owned] { owned->reset(); });
}

float ZeroTrainer::forward_backward(const Batch& batch) {
  if (micro_batches_ == options_.gradient_accumulation_steps) {
    throw Error(ErrorKind::kUsage,
                "forward_backward called more than gradient_accumulation_steps (" +
                    std::to_string(options_.gradient_accumulation_steps) +
                    ") times since the last step(); call step()");
  }
  ++micro_batches_;
  const bool last_micro_batch = micro_batches_ == options_.gradient_accumulation_steps;
  float* loss = loss_buffer_.as<float>();
  run_forward(batch, loss);
  // Stages 0-1 keep full gradients and reduce them once per step; stages 2-3 must reduce every
  // micro-batch, since only the shard is kept between them.
  run_backward(batch, loss, options_.stage >= 2 || last_micro_batch);
  // Note: reading the loss needs the compute stream to finish this micro-batch; the comm stream
  // goes on reducing gradients meanwhile.
  context_.compute.synchronize();
  loss_sum_ += *loss;
  return *loss;
}

void ZeroTrainer::run_forward(const Batch& batch, float* /*loss*/) {
  for (FlatUnit& unit : units_) {
    float* params = acquire_params(unit);
    std::vector<float*> borrowed_params;
    for (int b : unit.borrowed) borrowed_params.push_back(acquire_params(units_[b]));
    Context context(*this, unit, batch, params, nullptr, borrowed_params, {});
    unit.unit->forward(context);
    for (int b : unit.borrowed) release_params(units_[b]);
    release_params(unit);
  }
}

void ZeroTrainer::run_backward(const Batch& batch, float* /*loss*/, bool reduce_now) {
  for (int u = static_cast<int>(units_.size()) - 1; u >= 0; --u) {
    FlatUnit& unit = units_[u];
    float* params = acquire_params(unit);
    float* grads = gradient_target(unit);
    std::vector<float*> borrowed_params, borrowed_grads;
    for (int b : unit.borrowed) {
      borrowed_params.push_back(acquire_params(units_[b]));
      borrowed_grads.push_back(gradient_target(units_[b]));
    }
    Context context(*this, unit, batch, params, grads, borrowed_params, borrowed_grads);
    unit.unit->backward(context);
    for (int b : unit.borrowed) release_params(units_[b]);
    release_params(unit);
    // This unit's output and the gradient it received are no longer needed.
    release_on(context_.compute, std::move(activations_[u].output));
    if (u + 1 < static_cast<int>(units_.size())) {
      release_on(context_.compute, std::move(activations_[u + 1].grad_input));
    }
    if (reduce_now) reduce_gradients(unit);
  }
  release_on(context_.compute, std::move(activations_[0].grad_input));
}

void ZeroTrainer::reduce_gradients(FlatUnit& unit) {
  // The comm stream reduces this unit's gradients while compute goes on to the previous unit.
  Event& written = *backward_done_[unit.index];
  context_.compute.record(written);
  Stream& comm = context_.comm;
  comm.wait(written);
  const std::size_t shard = unit.layout.shard_length();
  float* grads = unit.grads.as<float>();
  switch (options_.stage) {
    case 0:
      context_.communicator.all_reduce(comm, grads, grads, unit.layout.flat_length(),
                                       DType::kFloat32, Reduction::kMean);
      break;
    case 1:
      context_.communicator.reduce_scatter(comm, grads, grads + context_.rank * shard, shard,
                                           DType::kFloat32, Reduction::kMean);
      break;
    default: {
      float* bucket = unit.bucket.as<float>();
      float* mine = bucket + context_.rank * shard;
      context_.communicator.reduce_scatter(comm, bucket, mine, shard, DType::kFloat32,
                                           Reduction::kMean);
      accumulate(comm, grads, mine, shard);
      release_on(comm, std::move(unit.bucket));
      comm.record(*bucket_released_[unit.index]);
      buckets_in_flight_.push_back(unit.index);
    }
  }
}

double ZeroTrainer::local_gradient_square_sum() {
  double sum = 0.0;
  for (FlatUnit& unit : units_) {
    const float* grads = unit.grads.as<float>();
    const std::size_t base = options_.stage >= 2 ? unit.layout.shard_range(context_.rank).begin : 0;
    for (const FlatUnit::UpdateRange& range : unit.update_ranges) {
      sum += cpu::sum_of_squares(grads + (range.flat_offset - base), range.count);
    }
  }
  return sum;
}

StepStats ZeroTrainer::step(float lr) {
  if (micro_batches_ != options_.gradient_accumulation_steps) {
    throw Error(ErrorKind::kUsage, "step() after " + std::to_string(micro_batches_) +
                                       " micro-batches; gradient_accumulation_steps is " +
                                       std::to_string(options_.gradient_accumulation_steps));
  }
  context_.comm.synchronize();
  // One all-reduce carries both the loss and the squared gradient norm.
  const int world = context_.world_size;
  const double square_sum = local_gradient_square_sum();
  float totals[2] = {static_cast<float>(loss_sum_ / options_.gradient_accumulation_steps / world),
                     static_cast<float>(options_.stage == 0 ? square_sum / world : square_sum)};
  context_.communicator.all_reduce(context_.comm, totals, totals, 2, DType::kFloat32,
                                   Reduction::kSum);
  context_.comm.synchronize();

  StepStats stats;
  stats.loss = totals[0];
  stats.grad_norm = std::sqrt(totals[1]);
  stats.lr = lr > 0.0f ? lr : optimizer_->options().lr;
  float grad_scale = 1.0f;
  if (options_.gradient_clipping > 0.0f && stats.grad_norm > options_.gradient_clipping) {
    // torch.nn.utils.clip_grad_norm_'s rule: scale by max_norm / (norm + 1e-6).
    grad_scale = options_.gradient_clipping / (stats.grad_norm + 1e-6f);
  }
  apply_optimizer(stats.lr, grad_scale);
  gather_updated_parameters();
  micro_batches_ = 0;
  loss_sum_ = 0.0;
  stats.step = ++steps_taken_;
  return stats;
}

void ZeroTrainer::apply_optimizer(float lr, float grad_scale) {
  UpdateArgs args;
  args.lr = lr;
  args.step = steps_taken_ + 1;
  args.grad_scale = grad_scale;
  Stream& compute = context_.compute;
  for (FlatUnit& unit : units_) {
    // Offsets are in the unit's flat coordinates; buffers that hold only the shard start at
    // the shard's first element.
    const std::size_t shard_begin = unit.layout.shard_range(context_.rank).begin;
    const std::size_t params_base = options_.stage == 3 ? shard_begin : 0;
    const std::size_t grads_base = options_.stage >= 2 ? shard_begin : 0;
    const std::size_t state_base = options_.stage >= 1 ? shard_begin : 0;
    for (const FlatUnit::UpdateRange& range : unit.update_ranges) {
      std::vector<float*> state;
      for (Buffer& buffer : unit.optimizer_state) {
        state.push_back(buffer.as<float>() + (range.flat_offset - state_base));
      }
      args.decay = range.decay;
      optimizer_->update(compute, unit.params.as<float>() + (range.flat_offset - params_base),
                         unit.grads.as<float>() + (range.flat_offset - grads_base), state,
                         range.count, args);
    }
    context_.device.fill_zero(compute, unit.grads.data(), unit.grads.bytes());
  }
}

void ZeroTrainer::gather_updated_parameters() {
  context_.compute.record(*optimizer_done_);
  context_.comm.wait(*optimizer_done_);
  if (options_.stage == 1 || options_.stage == 2) {
    for (FlatUnit& unit : units_) {
      const std::size_t shard = unit.layout.shard_length();
      float* params = unit.params.as<float>();
      context_.communicator.all_gather(context_.comm, params + context_.rank * shard, params,
                                       shard, DType::kFloat32);
    }
  }
  if (ring_) ring_->clear();
  context_.comm.record(*parameters_ready_);
  context_.compute.wait(*parameters_ready_);
}

std::vector<std::string> ZeroTrainer::parameter_names() const {
  std::vector<std::string> names;
  for (const FlatUnit& unit : units_) {
    for (std::size_t p = 0; p < unit.specs.size(); ++p) names.push_back(unit.param_name(p));
  }
  return names;
}

std::vector<float> ZeroTrainer::full_parameter(const std::string& name) {
  for (FlatUnit& unit : units_) {
    for (std::size_t p = 0; p < unit.specs.size(); ++p) {
      if (unit.param_name(p) != name) continue;
      const ParamSlot& slot = unit.layout.params()[p];
      context_.synchronize();
      if (options_.stage < 3) {
        const float* params = unit.params.as<float>() + slot.offset;
        return std::vector<float>(params, params + slot.numel);
      }
      Buffer full = context_.allocator().allocate(unit.layout.flat_length() * sizeof(float),
                                                  Category::kWorkspace);
      context_.communicator.all_gather(context_.comm, unit.params.data(), full.data(),
                                       unit.layout.shard_length(), DType::kFloat32);
      context_.comm.synchronize();
      const float* params = full.as<float>() + slot.offset;
      return std::vector<float>(params, params + slot.numel);
    }
  }
  throw Error(ErrorKind::kUsage, "no parameter named '" + name + "'");
}

MemoryPrediction ZeroTrainer::predicted_memory() const {
  // DESIGN.md's table with fp32 compute: params and grads 4 bytes, optimizer 4 × states, each
  // over the full flat buffer or the shard depending on the stage.
  MemoryPrediction prediction;
  const int stage = options_.stage;
  for (const FlatUnit& unit : units_) {
    const std::size_t full = unit.layout.flat_length() * sizeof(float);
    const std::size_t shard = unit.layout.shard_length() * sizeof(float);
    prediction.params += stage == 3 ? shard : full;
    prediction.grads += stage >= 2 ? shard : full;
    prediction.optimizer += (stage == 0 ? full : shard) * optimizer_->state_count();
  }
  return prediction;
}

Engine::Engine(RankContext& context, EngineOptions options)
    : context_(context), options_(std::move(options)) {}

std::unique_ptr<Trainer> Engine::shard(Module& module, std::unique_ptr<Optimizer> optimizer) {
  if (!optimizer) throw Error(ErrorKind::kUsage, "Engine::shard needs an optimizer");
  return std::make_unique<ZeroTrainer>(context_, options_, module, std::move(optimizer));
}

}  // namespace zest
