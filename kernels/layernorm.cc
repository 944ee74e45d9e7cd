#include "kernels/layernorm.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/blocked_loop.h"
#include "kernels/dispatch.h"
#include "kernels/layernorm_body.h"

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
namespace {

// Note: every row reduction keeps kLanes partial sums (element j in lane j % kLanes) folded
// pairwise at the end: independent additions that run as vector code, in an order that is still
// fixed, so results are the same run to run. The elementwise loops go through for_each_block
// for the same reason (kernels/blocked_loop.h).
constexpr std::int64_t kLanes = kLayerNormLanes;

template <typename T>
T fold(T* lanes) {
  for (std::int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (std::int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

double row_sum(const float* row, std::int64_t cols) {
  double lanes[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    for (std::int64_t l = 0; l < kLanes; ++l) lanes[l] += row[j + l];
  }
  for (; j < cols; ++j) lanes[j % kLanes] += row[j];
  return fold(lanes);
}

double row_centered_square_sum(const float* row, std::int64_t cols, double m) {
  double lanes[kLanes] = {};
  std::int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    for (std::int64_t l = 0; l < kLanes; ++l) {
      const double centered = row[j + l] - m;
      lanes[l] += centered * centered;
    }
  }
  for (; j < cols; ++j) {
    const double centered = row[j] - m;
    lanes[j % kLanes] += centered * centered;
  }
  return fold(lanes);
}

}  // namespace

void layernorm_forward_portable(const float* x, const float* weight, const float* bias,
                                std::int64_t rows, std::int64_t cols, float eps, float* y,
                                float* mean, float* rstd) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* __restrict row = x + r * cols;
    float* __restrict out = y + r * cols;
    // Two passes in double: the variance of a row far from zero mean loses nothing.
    const double m = row_sum(row, cols) / static_cast<double>(cols);
    const double square_sum = row_centered_square_sum(row, cols, m);
    const double s = 1.0 / std::sqrt(square_sum / static_cast<double>(cols) + eps);
    // Normalized in double too: a row far from zero mean (or of tiny spread, large rstd) would
    // otherwise lose the rounding of the fp32 mean times rstd.
    for_each_block(static_cast<std::size_t>(cols), [&](std::size_t i, std::size_t n) {
      for (std::size_t j = i; j < i + n; ++j) {
        out[j] = static_cast<float>((row[j] - m) * s) * weight[j] + bias[j];
      }
    });
    mean[r] = static_cast<float>(m);
    rstd[r] = static_cast<float>(s);
  }
}

void layernorm_backward_portable(const float* dy, const float* x, const float* weight,
                                 const float* mean, const float* rstd, std::int64_t rows,
                                 std::int64_t cols, float* dx, float* dweight, float* dbias) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* __restrict drow = dy + r * cols;
    const float* __restrict row = x + r * cols;
    float* __restrict dxrow = dx + r * cols;
    const float m = mean[r];
    const float s = rstd[r];
    // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dy * weight.
    float dnorm_lanes[kLanes] = {};
    float dnorm_xhat_lanes[kLanes] = {};
    const auto add = [&](std::int64_t j, std::int64_t l) {
      const float xhat = (row[j] - m) * s;
      const float dnorm = drow[j] * weight[j];
      dnorm_lanes[l] += dnorm;
      dnorm_xhat_lanes[l] += dnorm * xhat;
    };
    std::int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (std::int64_t l = 0; l < kLanes; ++l) add(j + l, l);
    }
    for (; j < cols; ++j) add(j, j % kLanes);
    const float dnorm_mean = fold(dnorm_lanes) * inv_cols;
    const float dnorm_xhat_mean = fold(dnorm_xhat_lanes) * inv_cols;
    for_each_block(static_cast<std::size_t>(cols), [&](std::size_t i, std::size_t n) {
      for (std::size_t k = i; k < i + n; ++k) {
        const float xhat = (row[k] - m) * s;
        const float dnorm = drow[k] * weight[k];
        dbias[k] += drow[k];
        dweight[k] += xhat * drow[k];
        dxrow[k] += s * (dnorm - dnorm_mean - xhat * dnorm_xhat_mean);
      }
    });
  }
}

void layernorm_forward(CpuBody body, const float* x, const float* weight, const float* bias,
                       std::int64_t rows, std::int64_t cols, float eps, float* y, float* mean,
                       float* rstd) {
  switch (body) {
#if defined(ZEST_HAVE_X86_BODIES)
    case CpuBody::kAvx512:
      return layernorm_forward_avx512(x, weight, bias, rows, cols, eps, y, mean, rstd);
    case CpuBody::kAvx2:
      return layernorm_forward_avx2(x, weight, bias, rows, cols, eps, y, mean, rstd);
#else
    case CpuBody::kAvx512:
    case CpuBody::kAvx2:
#endif
    case CpuBody::kPortable: break;
  }
  layernorm_forward_portable(x, weight, bias, rows, cols, eps, y, mean, rstd);
}

void layernorm_backward(CpuBody body, const float* dy, const float* x, const float* weight,
                        const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t cols, float* dx, float* dweight, float* dbias) {
  switch (body) {
#if defined(ZEST_HAVE_X86_BODIES)
    case CpuBody::kAvx512:
      return layernorm_backward_avx512(dy, x, weight, mean, rstd, rows, cols, dx, dweight, dbias);
    case CpuBody::kAvx2:
      return layernorm_backward_avx2(dy, x, weight, mean, rstd, rows, cols, dx, dweight, dbias);
#else
    case CpuBody::kAvx512:
    case CpuBody::kAvx2:
#endif
    case CpuBody::kPortable: break;
  }
  layernorm_backward_portable(dy, x, weight, mean, rstd, rows, cols, dx, dweight, dbias);
}

void layernorm_forward(const float* x, const float* weight, const float* bias, std::int64_t rows,
                       std::int64_t cols, float eps, float* y, float* mean, float* rstd) {
  layernorm_forward(selected_cpu_body(), x, weight, bias, rows, cols, eps, y, mean, rstd);
}

void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean,
                        const float* rstd, std::int64_t rows, std::int64_t cols, float* dx,
                        float* dweight, float* dbias) {
  layernorm_backward(selected_cpu_body(), dy, x, weight, mean, rstd, rows, cols, dx, dweight,
                     dbias);
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
  const CpuBody body = selected_cpu_body();
  dispatch_kernel(stream, "layernorm_forward", [=] {
    cpu::layernorm_forward(body, x, weight, bias, rows, cols, eps, y, mean, rstd);
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
  const CpuBody body = selected_cpu_body();
  dispatch_kernel(stream, "layernorm_backward", [=] {
    cpu::layernorm_backward(body, dy, x, weight, mean, rstd, rows, cols, dx, dweight, dbias);
  });
}

}  // namespace zest
