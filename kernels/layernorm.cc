#include "kernels/layernorm.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/layernorm_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_shape(const char* kernel, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": needs rows >= 0 and cols >= 1, got [" +
                                       std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
}

}  // namespace

namespace cpu {

void layernorm_forward(const float* x, const float* weight, const float* bias, std::int64_t rows,
                       std::int64_t cols, float eps, float* y, float* mean, float* rstd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* __restrict row = x + r * cols;
    float* __restrict out = y + r * cols;
    // Two passes in double: the variance of a row far from zero mean loses nothing.
    double sum = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) sum += row[j];
    const double m = sum / static_cast<double>(cols);
    double square_sum = 0.0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double centered = row[j] - m;
      square_sum += centered * centered;
    }
    const double s = 1.0 / std::sqrt(square_sum / static_cast<double>(cols) + eps);
    // Normalized in double too: a row far from zero mean (or of tiny spread, large rstd) would
    // otherwise lose the rounding of the fp32 mean times rstd.
    for (std::int64_t j = 0; j < cols; ++j) {
      out[j] = static_cast<float>((row[j] - m) * s) * weight[j] + bias[j];
    }
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(s);
  }
}

void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, std::int64_t rows, std::int64_t cols, float* dx,
                        float* dweight, float* dbias) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* __restrict drow = dy + r * cols;
    const float* __restrict row = x + r * cols;
    float* __restrict dxrow = dx + r * cols;
    const float m = mean[r];
    const float s = rstd[r];
    // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dy * weight.
    float dnorm_mean = 0.0f;
    float dnorm_xhat_mean = 0.0f;
    for (std::int64_t j = 0; j < cols; ++j) {
      const float xhat = (row[j] - m) * s;
      const float dnorm = drow[j] * weight[j];
      dnorm_mean += dnorm;
      dnorm_xhat_mean += dnorm * xhat;
    }
    dnorm_mean *= inv_cols;
    dnorm_xhat_mean *= inv_cols;
    for (std::int64_t j = 0; j < cols; ++j) {
      const float xhat = (row[j] - m) * s;
      const float dnorm = drow[j] * weight[j];
      dbias[j] += drow[j];
      dweight[j] += xhat * drow[j];
      dxrow[j] += s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
    }
  }
}

}  // namespace cpu

void layernorm_forward(Stream& stream, const float* x, const float* weight, const float* bias,
                       std::int64_t rows, std::int64_t cols, float eps, float* y, float* mean,
                       float* rstd) {
  check_shape("layernorm_forward", rows, cols);
  if (rows == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::layernorm_forward(x, weight, bias, rows, cols, eps, y, mean, rstd,
                            cuda::stream_handle(stream, "layernorm_forward"));
    return;
  }
#endif
  dispatch_kernel(stream, "layernorm_forward", [=] {
    cpu::layernorm_forward(x, weight, bias, rows, cols, eps, y, mean, rstd);
  });
}

void layernorm_backward(Stream& stream, const float* dy, const float* x, const float* weight,
                        const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t cols, float* dx, float* dweight, float* dbias) {
  check_shape("layernorm_backward", rows, cols);
  if (rows == 0) return;
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "layernorm_backward");
    const std::size_t bytes = cuda::layernorm_backward_workspace_bytes(rows, cols);
    cuda::layernorm_backward(dy, x, weight, mean, rstd, rows, cols, dx, dweight, dbias,
                             cuda.workspace(bytes, "layernorm_backward"), bytes, cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "layernorm_backward", [=] {
    cpu::layernorm_backward(dy, x, weight, mean, rstd, rows, cols, dx, dweight, dbias);
  });
}

}  // namespace zest
