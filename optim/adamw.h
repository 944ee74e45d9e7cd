// Adam and AdamW as Optimizers over flat fp32 ranges, calling kernels/adamw. They keep two
// state arrays, in this order: exp_avg (m) and exp_avg_sq (v), which start at zero. AdamW
// decays the weights themselves (decoupled); Adam adds the decay to the gradient (L2).
// Invariant: options are validated on construction (kConfig Errors under "optimizer.params");
// UpdateArgs::lr is used as given, so the caller resolves schedules and overrides.
#pragma once

#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace zest {

class AdamBase : public Optimizer {
 public:
  const std::string& name() const override { return options_.type; }
  const OptimizerOptions& options() const override { return options_; }
  std::size_t state_count() const override { return 2; }
  void update(Stream& stream, float* params, const float* grads, const std::vector<float*>& state,
              std::size_t count, const UpdateArgs& args) const override;
  // Writes the 2-byte copy in the kernel's own pass over the parameters.
  void update_and_round(Stream& stream, float* params, const float* grads,
                        const std::vector<float*>& state, std::size_t count,
                        const UpdateArgs& args, void* rounded, DType rounded_dtype) const override;

 protected:
  AdamBase(OptimizerOptions options, std::string canonical_name, bool decoupled);

 private:
  // rounded == nullptr: no copy.
  void run(Stream& stream, float* params, const float* grads, const std::vector<float*>& state,
           std::size_t count, const UpdateArgs& args, void* rounded, DType rounded_dtype) const;

  OptimizerOptions options_;
  bool decoupled_;
};

class AdamW final : public AdamBase {
 public:
  explicit AdamW(OptimizerOptions options) : AdamBase(std::move(options), "AdamW", true) {}
};

class Adam final : public AdamBase {
 public:
  explicit Adam(OptimizerOptions options) : AdamBase(std::move(options), "Adam", false) {}
};

}  // namespace zest
