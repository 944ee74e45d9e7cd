// The Adam / AdamW update of a flat fp32 range, with torch.optim.Adam/AdamW's exact formulas:
// grads are first multiplied by grad_scale; decoupled=true decays the weights (p -= lr*wd*p),
// false adds L2 to the gradient (g += wd*p); then m, v and p are updated with bias correction
// 1-beta^step. Invariant: step >= 1 counts updates already applied plus this one, and the four
// arrays hold `count` elements each and do not overlap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/stream.h"

namespace zest {

struct AdamWArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t step = 1;
  float grad_scale = 1.0f;
  bool decoupled = true;  // true: AdamW; false: Adam with L2 weight decay
};

namespace cpu {

// Synchronous body. Throws a kUsage Error for step < 1.
void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::size_t count,
           const AdamWArgs& args);

}  // namespace cpu

// Enqueues the update on `stream`. Arguments are checked here, on the host.
void adamw(Stream& stream, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args);

}  // namespace zest
