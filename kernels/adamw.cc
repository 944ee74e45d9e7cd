#include "kernels/adamw.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/blocked_loop.h"
#include "kernels/dispatch.h"

namespace zest {
namespace {

// Per-call constants, computed once in double as PyTorch does on the host, then rounded.
struct AdamCoefficients {
  float grad_scale, l2, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size, inv_sqrt_bias_correction2, eps;
};

AdamCoefficients coefficients(const AdamWArgs& args) {
  const double lr = args.lr;
  const double wd = args.weight_decay;
  const double step = static_cast<double>(args.step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(args.beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(args.beta2), step);
  return {args.grad_scale,
          static_cast<float>(args.decoupled ? 0.0 : wd),
          static_cast<float>(args.decoupled ? 1.0 - lr * wd : 1.0),
          args.beta1,
          1.0f - args.beta1,
          args.beta2,
          1.0f - args.beta2,
          static_cast<float>(lr / bias_correction1),
          static_cast<float>(1.0 / std::sqrt(bias_correction2)),
          args.eps};
}

void check_args(const AdamWArgs& args) {
  if (args.step < 1) {
    throw Error(ErrorKind::kUsage, "adamw: step must be >= 1, got " + std::to_string(args.step));
  }
}

// Note: the sqrt vectorizes only where this file is built with -fno-math-errno; otherwise GCC
// keeps a scalar call path for errno and the loop stays scalar (still correct).
inline void update_block(float* __restrict p, const float* __restrict g, float* __restrict m,
                         float* __restrict v, std::size_t n, const AdamCoefficients& c) {
  for (std::size_t i = 0; i < n; ++i) {
    const float grad = g[i] * c.grad_scale + c.l2 * p[i];
    const float mi = c.beta1 * m[i] + c.one_minus_beta1 * grad;
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * c.inv_sqrt_bias_correction2 + c.eps;
    p[i] = p[i] * c.decay - c.step_size * mi / denom;
  }
}

}  // namespace

namespace cpu {

void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::size_t count,
           const AdamWArgs& args) {
  check_args(args);
  const AdamCoefficients c = coefficients(args);
  for_each_block(count, [&](std::size_t i, std::size_t n) {
    update_block(params + i, grads + i, exp_avg + i, exp_avg_sq + i, n, c);
  });
}

}  // namespace cpu

void adamw(Stream& stream, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args) {
  check_args(args);
  if (count == 0) return;
  dispatch_kernel(stream, "adamw",
                  [=] { cpu::adamw(params, grads, exp_avg, exp_avg_sq, count, args); });
}

}  // namespace zest
