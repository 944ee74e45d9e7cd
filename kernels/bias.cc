#include "kernels/bias.h"

#include <string>

#include "base/error.h"
#include "kernels/blocked_loop.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/bias_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_shape(const char* kernel, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": negative shape [" +
                                       std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
}

// Restrict holds on function parameters, where GCC honours it (not on locals in a lambda).
inline void add_into(float* __restrict out, const float* __restrict in, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) out[j] += in[j];
}

}  // namespace

namespace cpu {

void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for_each_block(static_cast<std::size_t>(cols), [&](std::size_t offset, std::size_t n) {
      add_into(row + offset, bias + offset, n);
    });
  }
}

// Row by row, so dy is read once in memory order and the sums stay in dbias (cache-resident).
void bias_grad(const float* dy, float* dbias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * cols;
    for_each_block(static_cast<std::size_t>(cols), [&](std::size_t offset, std::size_t n) {
      add_into(dbias + offset, row + offset, n);
    });
  }
}

}  // namespace cpu

void add_bias(Stream& stream, float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  check_shape("add_bias", rows, cols);
  if (rows == 0 || cols == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::add_bias(y, bias, rows, cols, cuda::stream_handle(stream, "add_bias"));
    return;
  }
#endif
  dispatch_kernel(stream, "add_bias", [=] { cpu::add_bias(y, bias, rows, cols); });
}

void bias_grad(Stream& stream, const float* dy, float* dbias, std::int64_t rows,
               std::int64_t cols) {
  check_shape("bias_grad", rows, cols);
  if (rows == 0 || cols == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "bias_grad");
    const std::size_t bytes = cuda::bias_grad_workspace_bytes(rows, cols);
    cuda::bias_grad(dy, dbias, rows, cols, cuda.workspace(bytes, "bias_grad"), bytes,
                    cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "bias_grad", [=] { cpu::bias_grad(dy, dbias, rows, cols); });
}

}  // namespace zest
