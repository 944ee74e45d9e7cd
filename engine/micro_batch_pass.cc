#include "engine/micro_batch_pass.h"

#include <utility>

namespace zest {

Tensor MicroBatchPass::take_output(Buffer& owner) {
  if (activations_.empty()) return {};
  UnitActivations& last = activations_.back();
  owner = std::move(last.output);
  return owner.empty() ? Tensor{} : last.output_view;
}

Tensor MicroBatchPass::take_grad_input(Buffer& owner) {
  if (activations_.empty()) return {};
  UnitActivations& first = activations_[first_computing_];
  owner = std::move(first.grad_input);
  return owner.empty() ? Tensor{} : first.grad_input_view;
}

}  // namespace zest
