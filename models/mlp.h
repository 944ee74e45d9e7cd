// A multilayer perceptron classifier built on the Module contract: one unit per Linear layer
// ("layer0", "layer1", ...; params "weight" [out, in] and "bias" [out]), GELU (tanh form)
// after every layer but the last, and softmax cross-entropy against batch().targets (int32 [B])
// in the last unit, which writes the mean loss. Inputs are batch().inputs, float32 [B, sizes[0]].
// Invariant: sizes = [inputs, hidden..., classes], at least 2 entries, each >= 1 (else kConfig).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/module.h"

namespace zest {

struct MlpConfig {
  std::vector<std::int64_t> sizes;  // model.sizes
  // The first layer also makes d(loss)/d(inputs) through make_grad_input. Off in training,
  // where nothing reads it; gradient checks and input-saliency tools turn it on.
  bool input_gradient = false;
};

// Throws a kConfig Error naming "model.sizes" or "model.sizes[i]" when `config` is not allowed.
void validate(const MlpConfig& config);

class Mlp final : public Module {
 public:
  explicit Mlp(MlpConfig config);
  ~Mlp() override;

  std::vector<Unit*> units() override;
  // input_shape: [rows, sizes[0]].
  std::vector<UnitMemory> unit_memory(const std::vector<std::int64_t>& input_shape) const override;
  const MlpConfig& config() const { return config_; }
  std::int64_t parameter_count() const;
  // "Mlp 784-256-10: 2 layers, 203530 parameters"
  std::string describe() const;

 private:
  MlpConfig config_;
  std::vector<std::unique_ptr<Unit>> layers_;
};

}  // namespace zest
