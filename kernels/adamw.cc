#include "kernels/adamw.h"

#include <cmath>
#include <string>
#include <type_traits>

#include "base/error.h"
#include "kernels/adamw_body.h"
#include "kernels/blocked_loop.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/adamw_cuda.h"
#include "runtime/cuda_stream.h"
#endif
#include "kernels/kernel_threads.h"

namespace zest {
namespace {

using cpu::AdamCoefficients;

// Note: a piece for another thread is at least this long: 512Ki params move 14 MiB (about 1 ms
// at these machines' ~18 GB/s), against tens of microseconds to start and join a thread.
constexpr std::size_t kMinElementsPerThread = std::size_t{1} << 19;

cpu::AdamWBodyFunction body_function(CpuBody body) {
  if (!cpu_body_supported(body)) {
    throw Error(ErrorKind::kUsage,
                std::string("adamw: the ") + cpu_body_name(body) + " body cannot run here");
  }
  switch (body) {
#if defined(ZEST_HAVE_X86_BODIES)
    case CpuBody::kAvx2: return cpu::adamw_avx2;
    case CpuBody::kAvx512: return cpu::adamw_avx512;
#endif
    default: return cpu::adamw_portable;
  }
}

// Note: the sqrt vectorizes only where this file is built with -fno-math-errno; otherwise GCC
// keeps a scalar call path for errno and the loop stays scalar (still correct). The file is built
// with -ffp-contract=off, as are the SIMD bodies, so no build fuses a multiply-add here that the
// others round twice.
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

struct NoCopy {};

// Rounds each block right after updating it, while it is still in L1: one pass over memory.
template <typename Round>
void update_and_round(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                      std::size_t count, const AdamCoefficients& c, std::uint16_t* rounded,
                      Round round) {
  for_each_block(count, [&](std::size_t i, std::size_t n) {
    update_block(params + i, grads + i, exp_avg + i, exp_avg_sq + i, n, c);
    if constexpr (!std::is_same_v<Round, NoCopy>) {
      for (std::size_t k = i; k < i + n; ++k) rounded[k] = round(params[k]);
    }
  });
}

}  // namespace

namespace cpu {

AdamCoefficients adam_coefficients(const AdamWArgs& args) {
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

void check_adamw_args(const AdamWArgs& args, RoundedCopy copy) {
  if (args.step < 1) {
    throw Error(ErrorKind::kUsage, "adamw: step must be >= 1, got " + std::to_string(args.step));
  }
  if (copy.data != nullptr && copy.dtype != DType::kBFloat16 && copy.dtype != DType::kFloat16) {
    throw Error(ErrorKind::kUsage,
                std::string("adamw: the rounded copy must be bf16 or fp16, not ") +
                    dtype_name(copy.dtype));
  }
}

void adamw_portable(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                    std::size_t count, const AdamCoefficients& c, std::uint16_t* rounded,
                    DType rounded_dtype) {
  if (rounded == nullptr) {
    update_and_round(params, grads, exp_avg, exp_avg_sq, count, c, rounded, NoCopy{});
  } else if (rounded_dtype == DType::kBFloat16) {
    update_and_round(params, grads, exp_avg, exp_avg_sq, count, c, rounded,
                     [](float x) { return BFloat16::round_to_bits(x); });
  } else {
    update_and_round(params, grads, exp_avg, exp_avg_sq, count, c, rounded,
                     [](float x) { return Float16::round_to_bits(x); });
  }
}

void adamw(CpuBody body, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args, RoundedCopy copy) {
  check_adamw_args(args, copy);
  const AdamWBodyFunction run = body_function(body);
  const AdamCoefficients c = adam_coefficients(args);
  auto* rounded = static_cast<std::uint16_t*>(copy.data);
  parallel_blocks(count, kMinElementsPerThread, [&](std::size_t i, std::size_t n) {
    run(params + i, grads + i, exp_avg + i, exp_avg_sq + i, n, c,
        rounded == nullptr ? nullptr : rounded + i, copy.dtype);
  });
}

void adamw(float* params, const float* grads, float* exp_avg, float* exp_avg_sq, std::size_t count,
           const AdamWArgs& args, RoundedCopy copy) {
  adamw(selected_cpu_body(), params, grads, exp_avg, exp_avg_sq, count, args, copy);
}

}  // namespace cpu

void adamw(Stream& stream, float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
           std::size_t count, const AdamWArgs& args, RoundedCopy copy) {
  cpu::check_adamw_args(args, copy);
  const CpuBody body = selected_cpu_body();
  if (count == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::adamw(params, grads, exp_avg, exp_avg_sq, count, args, copy,
                cuda::stream_handle(stream, "adamw"));
    return;
  }
#endif
  dispatch_kernel(stream, "adamw", [=] {
    cpu::adamw(body, params, grads, exp_avg, exp_avg_sq, count, args, copy);
  });
}

}  // namespace zest
