#include "kernels/linear.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "base/error.h"
#include "kernels/bias.h"
#include "kernels/dispatch.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"

#if ZEST_HAVE_CUDA
#include "kernels/matmul_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {

namespace {

void check_shape(const char* kernel, std::int64_t rows, std::int64_t in, std::int64_t out) {
  if (rows < 0 || in < 1 || out < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": needs rows >= 0, in >= 1 and out >= 1, "
                                   "got rows " + std::to_string(rows) + ", in " +
                                   std::to_string(in) + ", out " + std::to_string(out));
  }
}

#if ZEST_HAVE_CUDA
// One cuBLASLt product y = x·Wᵀ (+ residual) with `epilogue`, on the stream's handle and scratch.
// Returns false, having queued nothing, where cuBLASLt has no algorithm with that epilogue (the
// caller runs the bias and GELU kernels apart); a plain product without one throws.
bool launch_linear(Stream& stream, const char* kernel, const float* x, const float* weight,
                   const float* bias, std::int64_t rows, std::int64_t in, std::int64_t out,
                   const float* residual, float* y, cuda::MatmulEpilogue epilogue,
                   float* gelu_input) {
  cuda::CudaStream& cuda = cuda::cuda_stream(stream, kernel);
  cuda::MatmulArgs args;
  args.trans_b = true;
  args.m = rows;
  args.n = out;
  args.k = in;
  args.a = x;
  args.b = weight;
  args.beta = residual != nullptr ? 1.0f : 0.0f;
  args.c = residual == y ? nullptr : residual;  // null with beta 1: D in place
  args.d = y;
  args.epilogue = epilogue;
  args.bias = bias;
  args.gelu_input = gelu_input;
  const cuda::MatmulContext context = cuda::stream_matmul_context(cuda, kernel);
  if (epilogue == cuda::MatmulEpilogue::kNone) {
    cuda::matmul(args, context, cuda.handle());
    return true;
  }
  return cuda::try_matmul(args, context, cuda.handle());
}

// Note: cuBLASLt is told how A, B, C and D are aligned (matmul_cuda.cu asks only for algorithms
// that need no more), but not the bias or the pre-GELU matrix, and an epilogue kernel may read or
// write those in 16-byte vectors: Marian requires 16-byte biases since an A100 faulted with
// "misaligned address", and PyTorch has reported the same. A bias is a view into a flat buffer at
// any 4-byte offset, so the epilogue is used only where both are 16-byte aligned (and where
// cuBLASLt has an algorithm with it); elsewhere the product and the bias (and GELU) kernels run
// apart: the same sums in another order.
bool epilogue_may_use(const float* bias, const float* gelu_input) {
  constexpr std::uintptr_t kEpilogueAlignment = 16;
  return reinterpret_cast<std::uintptr_t>(bias) % kEpilogueAlignment == 0 &&
         reinterpret_cast<std::uintptr_t>(gelu_input) % kEpilogueAlignment == 0;
}
#endif

}  // namespace

void linear_forward(Stream& stream, const float* x, const float* weight, const float* bias,
                    std::int64_t rows, std::int64_t in, std::int64_t out, const float* residual,
                    float* y) {
  check_shape("linear_forward", rows, in, out);
  if (rows == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream) && epilogue_may_use(bias, nullptr) &&
      launch_linear(stream, "linear_forward", x, weight, bias, rows, in, out, residual, y,
                    cuda::MatmulEpilogue::kBias, nullptr)) {
    return;
  }
  if (on_cuda(stream)) {
    launch_linear(stream, "linear_forward", x, weight, nullptr, rows, in, out, residual, y,
                  cuda::MatmulEpilogue::kNone, nullptr);
    add_bias(stream, y, bias, rows, out);
    return;
  }
#endif
  dispatch_kernel(stream, "linear_forward", [=] {
    if (residual == nullptr) {
      cpu::matmul(false, true, rows, out, in, 1.0f, x, weight, 0.0f, y);
      cpu::add_bias(y, bias, rows, out);
      return;
    }
    // The block's order before this kernel: the residual, its bias, then the product added.
    if (residual != y) {
      std::memcpy(y, residual, static_cast<std::size_t>(rows * out) * sizeof(float));
    }
    cpu::add_bias(y, bias, rows, out);
    cpu::matmul(false, true, rows, out, in, 1.0f, x, weight, 1.0f, y);
  });
}

void linear_gelu_forward(Stream& stream, const float* x, const float* weight, const float* bias,
                         std::int64_t rows, std::int64_t in, std::int64_t out, float* pre,
                         float* post) {
  check_shape("linear_gelu_forward", rows, in, out);
  if (rows == 0) return;
  const auto count = static_cast<std::size_t>(rows * out);
#if ZEST_HAVE_CUDA
  // Note: cuBLASLt keeps the pre-GELU matrix only for a width that is a multiple of 8; other
  // widths take the three kernels. So does exact fp32 (the stream's products not rounded to a
  // 2-byte type): cuBLASLt's GELU is its own undocumented tanh, where the GELU kernel has the
  // CPU's constants and roundings, and fp32 training is held to the CPU's numbers (1e-4). In
  // 2-byte training the products' rounding dwarfs any tanh's, and the fused pass is the point.
  if (on_cuda(stream) && out % 8 == 0 && epilogue_may_use(bias, pre) &&
      cuda::cuda_stream(stream, "linear_gelu_forward").fp32_matmul_rounding() !=
          DType::kFloat32 &&
      launch_linear(stream, "linear_gelu_forward", x, weight, bias, rows, in, out, nullptr, post,
                    cuda::MatmulEpilogue::kGeluBias, pre)) {
    return;
  }
  if (on_cuda(stream)) {
    (void)cuda::cuda_stream(stream, "linear_gelu_forward");  // refused as this kernel, not matmul
    matmul(stream, false, true, rows, out, in, 1.0f, x, weight, 0.0f, pre);
    add_bias(stream, pre, bias, rows, out);
    gelu_forward(stream, pre, post, count);
    return;
  }
#endif
  dispatch_kernel(stream, "linear_gelu_forward", [=] {
    cpu::matmul(false, true, rows, out, in, 1.0f, x, weight, 0.0f, pre);
    cpu::add_bias(pre, bias, rows, out);
    cpu::gelu_forward(pre, post, count);
  });
}

bool linear_gelu_post_is_gelu_of_pre(Stream& stream, std::int64_t out) {
#if ZEST_HAVE_CUDA
  // The condition of linear_gelu_forward's fused branch but the buffers' alignment, which this
  // does not see: a `false` where the branch was not taken costs only the product again.
  if (on_cuda(stream) && out % 8 == 0 &&
      cuda::cuda_stream(stream, "linear_gelu_forward").fp32_matmul_rounding() != DType::kFloat32) {
    return false;
  }
#else
  (void)stream;
  (void)out;
#endif
  return true;
}

}  // namespace zest
