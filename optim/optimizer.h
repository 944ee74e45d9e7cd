// An optimizer updates a contiguous run of fp32 parameters from their gradients, keeping its
// state (moments) in fp32 arrays of the same length. It sees only flat ranges — a rank's shard,
// cut at parameter boundaries so weight decay can differ per parameter — never a model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "runtime/stream.h"

namespace zest {

struct OptimizerOptions {
  std::string type = "AdamW";  // "AdamW", "Adam" (L2 weight decay) or "SGD"
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;  // SGD
  bool nesterov = false;  // SGD
};

struct UpdateArgs {
  float lr = 0.0f;
  std::int64_t step = 1;    // 1 for the first update (bias correction)
  bool decay = true;        // false: no weight decay for this range (biases, norms)
  float grad_scale = 1.0f;  // gradients are multiplied by this first (clipping, unscaling)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual const std::string& name() const = 0;
  virtual const OptimizerOptions& options() const = 0;
  // How many fp32 state arrays, each as long as the parameters, the optimizer keeps.
  virtual std::size_t state_count() const = 0;
  // Enqueues the update of params[0, count) on `stream`. `state` holds state_count() arrays.
  virtual void update(Stream& stream, float* params, const float* grads,
                      const std::vector<float*>& state, std::size_t count,
                      const UpdateArgs& args) const = 0;
  // Enqueues the update of fp32 master weights params[0, count), then writes them rounded to
  // nearest even into `rounded` (count elements of the 2-byte `rounded_dtype`): the parameters
  // of mixed precision, exactly as convert() would. This default converts in a second pass; an
  // optimizer whose kernel writes the copy in its own pass overrides it.
  virtual void update_and_round(Stream& stream, float* params, const float* grads,
                                const std::vector<float*>& state, std::size_t count,
                                const UpdateArgs& args, void* rounded, DType rounded_dtype) const;
};

// Throws a kConfig Error naming "optimizer.type" for an unknown type and the offending key under
// "optimizer.params" for a value out of range.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options);

}  // namespace zest
