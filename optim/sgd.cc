#include "optim/sgd.h"

#include <cmath>

#include "base/error.h"
#include "kernels/sgd.h"
#include "optim/optimizer_validation.h"

namespace zest {

Sgd::Sgd(OptimizerOptions options) : options_(std::move(options)) {
  validate_common_options(options_);
  require_option(std::isfinite(options_.momentum) && options_.momentum >= 0, "momentum", ">= 0",
                 options_.momentum);
  if (options_.nesterov && options_.momentum == 0) {
    // As torch.optim.SGD: Nesterov momentum needs a momentum to look ahead with.
    throw Error(ErrorKind::kConfig, "optimizer.params.nesterov: requires momentum > 0");
  }
  options_.type = "SGD";
}

void Sgd::update(Stream& stream, float* params, const float* grads,
                 const std::vector<float*>& state, std::size_t count,
                 const UpdateArgs& args) const {
  check_state(name(), state, state_count());
  SgdArgs kernel_args;
  kernel_args.lr = args.lr;
  kernel_args.momentum = options_.momentum;
  kernel_args.weight_decay = args.decay ? options_.weight_decay : 0.0f;
  kernel_args.nesterov = options_.nesterov;
  kernel_args.step = args.step;
  kernel_args.grad_scale = args.grad_scale;
  sgd(stream, params, grads, state.empty() ? nullptr : state[0], count, kernel_args);
}

}  // namespace zest
