// The Adam / AdamW update of a flat fp32 range, with torch.optim.Adam/AdamW's exact formulas:
// grads are first multiplied by grad_scale; decoupled=true decays the weights (p -= lr*wd*p),
// false adds L2 to the gradient (g += wd*p); then m, v and p are updated with bias correction
// 1-beta^step. Invariant: step >= 1 counts updates already applied plus this one, and the four
// arrays hold `count` elements each and do not overlap.
// The CPU body is portable C++ or AVX2 / AVX-512 (kernels/cpu_body.h: chosen at run time,
// ZEST_CPU_KERNEL overrides); all give bit-identical results. A call splits a long range over
// kernel_threads() threads (kernels/kernel_threads.h, default 1).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "kernels/cpu_body.h"
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

// Where the same pass also writes the updated parameters rounded to nearest even into a 2-byte
// dtype (the compute copy of fp32 master weights): exactly what convert() of the updated fp32
// parameters writes. data == nullptr: no copy. data views `count` elements of `dtype` (kBFloat16
// or kFloat16) and does not overlap the other arrays.
struct RoundedCopy {
  void* data = nullptr;
  DType dtype = DType::kBFloat16;
};

namespace cpu {

// Synchronous body, run by selected_cpu_body(). Throws a kUsage Error for step < 1 or a copy
// dtype that is not 2-byte.
void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::size_t count,
           const AdamWArgs& args, RoundedCopy copy = {});

// The same, by the given body; a kUsage Error when !cpu_body_supported(body).
void adamw(CpuBody body, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args, RoundedCopy copy = {});

}  // namespace cpu

// Enqueues the update on `stream`. Arguments (and the body) are checked here, on the host.
void adamw(Stream& stream, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args, RoundedCopy copy = {});

}  // namespace zest
