#include "models/mlp.h"

#include <climits>
#include <cmath>
#include <utility>

#include "base/error.h"
#include "kernels/bias.h"
#include "kernels/cross_entropy.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"

namespace zest {
namespace {

std::string tensor_to_string(const Tensor& tensor) {
  return std::string(dtype_name(tensor.dtype)) + " " + shape_to_string(tensor.shape);
}

// One Linear layer, followed by GELU or, in the last layer, by the loss.
class LinearLayer final : public Unit {
 public:
  LinearLayer(std::size_t index, std::int64_t in, std::int64_t out, bool last, bool grad_input)
      : name_("layer" + std::to_string(index)),
        in_(in),
        out_(out),
        last_(last),
        makes_grad_input_(grad_input) {}

  const std::string& name() const override { return name_; }
  std::vector<ParamSpec> parameters() const override;
  void forward(UnitContext& context) override;
  void backward(UnitContext& context) override;
  // Split backward: dz and dx first, dW and db later from the kept dz and the input.
  bool supports_split_backward() const override { return true; }
  void backward_input(UnitContext& context) override;
  void backward_weight(UnitContext& context) override;
  // What forward and backward allocate for `rows` rows; forward allocates by it.
  UnitMemory memory(std::int64_t rows) const;

 private:
  std::int64_t checked_rows(const Tensor& input) const;
  const std::int32_t* checked_targets(const Batch& batch, std::int64_t rows) const;
  const float* checked_grad_output(const Tensor& grad_output, std::int64_t rows) const;
  // Turns z into dz in place: from the loss in the last layer, through GELU in the others.
  void enqueue_grad_of_z(UnitContext& context, std::int64_t rows, float* z) const;

  const std::string name_;
  const std::int64_t in_;
  const std::int64_t out_;
  const bool last_;
  const bool makes_grad_input_;
  // The pre-activation z = x W^T + b [rows, out], kept from forward for backward (category
  // activations); backward turns it into dz in place and hands it to release().
  Buffer saved_;
  std::int64_t saved_rows_ = 0;
  bool holds_dz_ = false;  // backward_input ran: saved_ holds dz for backward_weight
};

std::vector<ParamSpec> LinearLayer::parameters() const {
  // As torch.nn.Linear: both drawn from U(-1/sqrt(in), 1/sqrt(in)).
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  const Initializer init = Initializer::uniform(-bound, bound);
  return {{"weight", {out_, in_}, init, true}, {"bias", {out_}, init, false}};
}

UnitMemory LinearLayer::memory(std::int64_t rows) const {
  UnitMemory memory;
  memory.saved = static_cast<std::size_t>(rows * out_) * sizeof(float);  // z, then dz
  memory.output = last_ ? 0 : Tensor{nullptr, {rows, out_}, DType::kFloat32}.bytes();
  memory.grad_input = makes_grad_input_ ? Tensor{nullptr, {rows, in_}, DType::kFloat32}.bytes() : 0;
  memory.forward_stream_scratch = kCudaMatmulWorkspaceBytes;
  memory.backward_stream_scratch = kCudaMatmulWorkspaceBytes;
  memory.split_backward = true;  // dz stays in `saved` until backward_weight
  return memory;
}

std::int64_t LinearLayer::checked_rows(const Tensor& input) const {
  const bool ok = input.dtype == DType::kFloat32 && input.rank() == 2 && input.dim(0) >= 1 &&
                  input.dim(1) == in_ && !input.empty();
  if (!ok) {
    throw Error(ErrorKind::kUsage, name_ + ": input must be float32 [B, " + std::to_string(in_) +
                                       "] with B >= 1, got " + tensor_to_string(input));
  }
  return input.dim(0);
}

const std::int32_t* LinearLayer::checked_targets(const Batch& batch, std::int64_t rows) const {
  const Tensor& targets = batch.targets;
  if (targets.dtype != DType::kInt32 || targets.shape != std::vector<std::int64_t>{rows} ||
      targets.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": targets must be int32 [" + std::to_string(rows) +
                                       "], got " + tensor_to_string(targets));
  }
  return targets.as<const std::int32_t>();
}

const float* LinearLayer::checked_grad_output(const Tensor& grad_output, std::int64_t rows) const {
  if (grad_output.dtype != DType::kFloat32 ||
      grad_output.shape != std::vector<std::int64_t>{rows, out_} || grad_output.empty()) {
    throw Error(ErrorKind::kUsage, name_ + ": grad_output must be float32 [" +
                                       std::to_string(rows) + ", " + std::to_string(out_) +
                                       "], got " + tensor_to_string(grad_output));
  }
  return grad_output.as<const float>();
}

void LinearLayer::forward(UnitContext& context) {
  const Tensor input = context.input();
  const std::int64_t rows = checked_rows(input);
  const std::int32_t* targets = last_ ? checked_targets(context.batch(), rows) : nullptr;
  Stream& stream = context.stream();
  // A forward whose backward never ran (evaluation, a failed step) may leave a buffer behind.
  if (!saved_.empty()) context.release(std::move(saved_));
  holds_dz_ = false;
  // Note: everything is allocated before any work is enqueued, so an out-of-memory leaves no
  // work on the stream that writes into a buffer the unwinding frees.
  const std::size_t elements = static_cast<std::size_t>(rows * out_);
  Buffer z_buffer = context.allocate(memory(rows).saved, Category::kActivations);
  float* y = last_ ? nullptr : context.make_output({rows, out_}, DType::kFloat32).as<float>();
  saved_ = std::move(z_buffer);
  saved_rows_ = rows;
  float* z = saved_.as<float>();

  matmul(stream, false, true, rows, out_, in_, 1.0f, input.as<const float>(),
         context.param(0).as<const float>(), 0.0f, z);
  add_bias(stream, z, context.param(1).as<const float>(), rows, out_);
  if (last_) {
    cross_entropy_forward(stream, z, targets, rows, out_, context.loss());
  } else {
    gelu_forward(stream, z, y, elements);
  }
  if (!context.backward_follows()) context.release(std::move(saved_));
}

void LinearLayer::enqueue_grad_of_z(UnitContext& context, std::int64_t rows, float* z) const {
  if (last_) {
    // The loss seeds the gradient, scaled by loss_scale(): dlogits, in place.
    cross_entropy_backward(context.stream(), z, checked_targets(context.batch(), rows), rows, out_,
                           context.loss_scale(), z);
  } else {
    const float* dy = checked_grad_output(context.grad_output(), rows);
    gelu_backward(context.stream(), z, dy, z, static_cast<std::size_t>(rows * out_));
  }
}

void LinearLayer::backward(UnitContext& context) {
  if (saved_.empty()) throw Error(ErrorKind::kUsage, name_ + ": backward without a forward");
  const Tensor input = context.input();
  const std::int64_t rows = checked_rows(input);
  if (rows != saved_rows_) {
    throw Error(ErrorKind::kUsage, name_ + ": backward over " + std::to_string(rows) +
                                       " rows after a forward over " + std::to_string(saved_rows_));
  }
  Stream& stream = context.stream();
  float* dz = saved_.as<float>();  // z becomes dz in place: both kernels allow it
  // Allocated before anything is enqueued, as in forward.
  float* dx = makes_grad_input_ ? context.make_grad_input({rows, in_}, DType::kFloat32).as<float>()
                                : nullptr;

  enqueue_grad_of_z(context, rows, dz);
  // dW += dz^T x and db += colsum(dz): gradients accumulate (beta = 1).
  matmul(stream, true, false, out_, in_, rows, 1.0f, dz, input.as<const float>(), 1.0f,
         context.grad(0).as<float>());
  bias_grad(stream, dz, context.grad(1).as<float>(), rows, out_);
  if (dx != nullptr) {
    matmul(stream, false, false, rows, in_, out_, 1.0f, dz, context.param(0).as<const float>(),
           0.0f, dx);
  }
  context.release(std::move(saved_));
}

void LinearLayer::backward_input(UnitContext& context) {
  if (saved_.empty() || holds_dz_) {
    throw Error(ErrorKind::kUsage, name_ + ": backward_input without a forward");
  }
  const std::int64_t rows = checked_rows(context.input());
  float* dz = saved_.as<float>();
  float* dx = makes_grad_input_ ? context.make_grad_input({rows, in_}, DType::kFloat32).as<float>()
                                : nullptr;
  enqueue_grad_of_z(context, rows, dz);
  if (dx != nullptr) {
    matmul(context.stream(), false, false, rows, in_, out_, 1.0f, dz,
           context.param(0).as<const float>(), 0.0f, dx);
  }
  holds_dz_ = true;
}

void LinearLayer::backward_weight(UnitContext& context) {
  if (!holds_dz_) throw Error(ErrorKind::kUsage, name_ + ": backward_weight before backward_input");
  const Tensor input = context.input();
  const std::int64_t rows = checked_rows(input);
  const float* dz = saved_.as<const float>();
  // The same kernels on the same operands as backward(): the same bits.
  matmul(context.stream(), true, false, out_, in_, rows, 1.0f, dz, input.as<const float>(), 1.0f,
         context.grad(0).as<float>());
  bias_grad(context.stream(), dz, context.grad(1).as<float>(), rows, out_);
  holds_dz_ = false;
  context.release(std::move(saved_));
}

}  // namespace

void validate(const MlpConfig& config) {
  const auto& sizes = config.sizes;
  if (sizes.size() < 2) {
    throw Error(ErrorKind::kConfig,
                "model.sizes: needs at least 2 entries (inputs and classes), got " +
                    std::to_string(sizes.size()));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    // Note: the upper bound is the int32 of class targets and of cblas dimensions.
    if (sizes[i] < 1 || sizes[i] > INT_MAX) {
      throw Error(ErrorKind::kConfig, "model.sizes[" + std::to_string(i) +
                                          "]: must be in [1, 2147483647], got " +
                                          std::to_string(sizes[i]));
    }
  }
}

Mlp::Mlp(MlpConfig config) : config_(std::move(config)) {
  validate(config_);
  const std::size_t layers = config_.sizes.size() - 1;
  for (std::size_t i = 0; i < layers; ++i) {
    const bool grad_input = i > 0 || config_.input_gradient;
    layers_.push_back(std::make_unique<LinearLayer>(i, config_.sizes[i], config_.sizes[i + 1],
                                                    i + 1 == layers, grad_input));
  }
}

Mlp::~Mlp() = default;

std::vector<Unit*> Mlp::units() {
  std::vector<Unit*> units;
  for (const auto& layer : layers_) units.push_back(layer.get());
  return units;
}

std::vector<UnitMemory> Mlp::unit_memory(const std::vector<std::int64_t>& input_shape) const {
  const std::int64_t rows = input_shape.empty() ? 0 : input_shape.front();
  std::vector<UnitMemory> memory;
  for (const auto& layer : layers_) memory.push_back(static_cast<const LinearLayer&>(*layer).memory(rows));
  return memory;
}

std::int64_t Mlp::parameter_count() const {
  std::int64_t count = 0;
  for (std::size_t i = 0; i + 1 < config_.sizes.size(); ++i) {
    count += (config_.sizes[i] + 1) * config_.sizes[i + 1];
  }
  return count;
}

std::string Mlp::describe() const {
  std::string widths;
  for (std::int64_t size : config_.sizes) {
    widths += (widths.empty() ? "" : "-") + std::to_string(size);
  }
  return "Mlp " + widths + ": " + std::to_string(layers_.size()) + " layers, " +
         std::to_string(parameter_count()) + " parameters";
}

}  // namespace zest
