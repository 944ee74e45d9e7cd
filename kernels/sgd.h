// The SGD update of a flat fp32 range with torch.optim.SGD's semantics (dampening 0): grads are
// first multiplied by grad_scale, then g += wd*p; with momentum, buf = g on step 1 and
// buf = momentum*buf + g after, and g = nesterov ? g + momentum*buf : buf; finally p -= lr*g.
// Invariant: `momentum_buffer` may be null only when momentum == 0; on step 1 its old contents
// are never read, so it need not be initialized.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/stream.h"

namespace zest {

struct SgdArgs {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  std::int64_t step = 1;
  float grad_scale = 1.0f;
};

namespace cpu {

// Synchronous body. Throws a kUsage Error for step < 1, or momentum > 0 without a buffer.
void sgd(float* params, const float* grads, float* momentum_buffer, std::size_t count,
         const SgdArgs& args);

}  // namespace cpu

// Enqueues the update on `stream`. Arguments are checked here, on the host.
void sgd(Stream& stream, float* params, const float* grads, float* momentum_buffer,
         std::size_t count, const SgdArgs& args);

}  // namespace zest
