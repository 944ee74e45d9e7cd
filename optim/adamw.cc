#include "optim/adamw.h"

#include <cmath>

#include "kernels/adamw.h"
#include "optim/optimizer_validation.h"

namespace zest {
namespace {

void validate_adam_options(const OptimizerOptions& options) {
  validate_common_options(options);
  require_option(options.beta1 >= 0 && options.beta1 < 1, "betas[0]", "in [0, 1)", options.beta1);
  require_option(options.beta2 >= 0 && options.beta2 < 1, "betas[1]", "in [0, 1)", options.beta2);
  require_option(std::isfinite(options.eps) && options.eps >= 0, "eps", ">= 0", options.eps);
}

}  // namespace

AdamBase::AdamBase(OptimizerOptions options, std::string canonical_name, bool decoupled)
    : options_(std::move(options)), decoupled_(decoupled) {
  validate_adam_options(options_);
  options_.type = std::move(canonical_name);
}

void AdamBase::update(Stream& stream, float* params, const float* grads,
                      const std::vector<float*>& state, std::size_t count,
                      const UpdateArgs& args) const {
  run(stream, params, grads, state, count, args, nullptr, DType::kFloat32);
}

void AdamBase::update_and_round(Stream& stream, float* params, const float* grads,
                                const std::vector<float*>& state, std::size_t count,
                                const UpdateArgs& args, void* rounded,
                                DType rounded_dtype) const {
  run(stream, params, grads, state, count, args, rounded, rounded_dtype);
}

void AdamBase::run(Stream& stream, float* params, const float* grads,
                   const std::vector<float*>& state, std::size_t count, const UpdateArgs& args,
                   void* rounded, DType rounded_dtype) const {
  check_state(name(), state, state_count());
  AdamWArgs kernel_args;
  kernel_args.lr = args.lr;
  kernel_args.beta1 = options_.beta1;
  kernel_args.beta2 = options_.beta2;
  kernel_args.eps = options_.eps;
  kernel_args.weight_decay = args.decay ? options_.weight_decay : 0.0f;
  kernel_args.step = args.step;
  kernel_args.grad_scale = args.grad_scale;
  kernel_args.decoupled = decoupled_;
  adamw(stream, params, grads, state[0], state[1], count, kernel_args,
        RoundedCopy{rounded, rounded_dtype});
}

}  // namespace zest
