#include "kernels/sgd.h"

#include <string>

#include "base/error.h"
#include "kernels/blocked_loop.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/sgd_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_args(const float* momentum_buffer, const SgdArgs& args) {
  if (args.step < 1) {
    throw Error(ErrorKind::kUsage, "sgd: step must be >= 1, got " + std::to_string(args.step));
  }
  if (args.momentum != 0.0f && momentum_buffer == nullptr) {
    throw Error(ErrorKind::kUsage, "sgd: momentum > 0 needs a momentum buffer");
  }
}

// Note: the loops read the arguments from locals; loads through `a` inside them would not be
// hoisted, and GCC then does not vectorize.
inline void plain_update(float* __restrict p, const float* __restrict g, std::size_t n,
                         const SgdArgs& a) {
  const float scale = a.grad_scale, wd = a.weight_decay, lr = a.lr;
  for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] * scale + wd * p[i]);
}

// `kFirstStep` starts the buffer from the gradient, as torch does when it has no buffer yet;
// the branch is resolved at compile time so the inner loop has none.
template <bool kFirstStep>
inline void momentum_update(float* __restrict p, const float* __restrict g, float* __restrict buf,
                            std::size_t n, const SgdArgs& a) {
  // nesterov: d = g + momentum*buf; otherwise d = buf. Exact in both cases (x*1 and 0+x).
  const float from_grad = a.nesterov ? 1.0f : 0.0f;
  const float from_buf = a.nesterov ? a.momentum : 1.0f;
  const float scale = a.grad_scale, wd = a.weight_decay, lr = a.lr, momentum = a.momentum;
  for (std::size_t i = 0; i < n; ++i) {
    const float grad = g[i] * scale + wd * p[i];
    const float b = kFirstStep ? grad : momentum * buf[i] + grad;
    buf[i] = b;
    p[i] -= lr * (from_grad * grad + from_buf * b);
  }
}

}  // namespace

namespace cpu {

void sgd(float* params, const float* grads, float* momentum_buffer, std::size_t count,
         const SgdArgs& args) {
  check_args(momentum_buffer, args);
  if (args.momentum == 0.0f) {
    for_each_block(
        count, [&](std::size_t i, std::size_t n) { plain_update(params + i, grads + i, n, args); });
  } else if (args.step == 1) {
    for_each_block(count, [&](std::size_t i, std::size_t n) {
      momentum_update<true>(params + i, grads + i, momentum_buffer + i, n, args);
    });
  } else {
    for_each_block(count, [&](std::size_t i, std::size_t n) {
      momentum_update<false>(params + i, grads + i, momentum_buffer + i, n, args);
    });
  }
}

}  // namespace cpu

void sgd(Stream& stream, float* params, const float* grads, float* momentum_buffer,
         std::size_t count, const SgdArgs& args) {
  check_args(momentum_buffer, args);
  if (count == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::sgd(params, grads, momentum_buffer, count, args, cuda::stream_handle(stream, "sgd"));
    return;
  }
#endif
  dispatch_kernel(stream, "sgd", [=] { cpu::sgd(params, grads, momentum_buffer, count, args); });
}

}  // namespace zest
