// SGD (with optional momentum and Nesterov) as an Optimizer over flat fp32 ranges, calling
// kernels/sgd. It keeps one state array, the momentum buffer, when momentum > 0 and none
// otherwise. Invariant: options are validated on construction (kConfig Errors under
// "optimizer.params"); UpdateArgs::lr is used as given, so the caller resolves schedules.
#pragma once

#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace zest {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(OptimizerOptions options);

  const std::string& name() const override { return options_.type; }
  const OptimizerOptions& options() const override { return options_; }
  std::size_t state_count() const override { return options_.momentum > 0 ? 1 : 0; }
  void update(Stream& stream, float* params, const float* grads, const std::vector<float*>& state,
              std::size_t count, const UpdateArgs& args) const override;

 private:
  OptimizerOptions options_;
};

}  // namespace zest
