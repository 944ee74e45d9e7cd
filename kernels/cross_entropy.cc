#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/cross_entropy_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_shape(const char* kernel, std::int64_t rows, std::int64_t classes) {
  if (rows < 1 || classes < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) +
                                       ": needs rows >= 1 and classes >= 1, got [" +
                                       std::to_string(rows) + ", " + std::to_string(classes) + "]");
  }
}

std::int32_t checked_target(const std::int32_t* targets, std::int64_t row, std::int64_t classes) {
  const std::int32_t target = targets[row];
  if (target < 0 || target >= classes) {
    throw Error(ErrorKind::kData, "cross_entropy: target of row " + std::to_string(row) + " is " +
                                      std::to_string(target) + ", outside [0, " +
                                      std::to_string(classes) + ")");
  }
  return target;
}

float row_max(const float* row, std::int64_t classes) {
  return *std::max_element(row, row + classes);
}

// sum_j exp(row[j] - max), accumulated in double: a row may have tens of thousands of classes.
double row_exp_sum(const float* row, std::int64_t classes, float max) {
  double sum = 0.0;
  for (std::int64_t j = 0; j < classes; ++j) sum += std::exp(row[j] - max);
  return sum;
}

}  // namespace

namespace cpu {

void cross_entropy_forward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t classes, float* loss) {
  check_shape("cross_entropy_forward", rows, classes);
  double total = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * classes;
    const std::int32_t target = checked_target(targets, r, classes);
    const float max = row_max(row, classes);
    // -log softmax[target] = log(sum exp(x - max)) - (x[target] - max)
    total += std::log(row_exp_sum(row, classes, max)) - static_cast<double>(row[target] - max);
  }
  *loss = static_cast<float>(total / static_cast<double>(rows));
}

void cross_entropy_backward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                            std::int64_t classes, float scale, float* dlogits) {
  check_shape("cross_entropy_backward", rows, classes);
  const float row_scale = scale / static_cast<float>(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * classes;
    float* drow = dlogits + r * classes;
    const std::int32_t target = checked_target(targets, r, classes);
    const float max = row_max(row, classes);
    const float inv_sum = static_cast<float>(1.0 / row_exp_sum(row, classes, max));
    // Each element is read before it is written, so drow may be row (in place).
    for (std::int64_t j = 0; j < classes; ++j) {
      drow[j] = std::exp(row[j] - max) * inv_sum * row_scale;
    }
    drow[target] -= row_scale;
  }
}

}  // namespace cpu

void cross_entropy_forward(Stream& stream, const float* logits, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t classes, float* loss) {
  check_shape("cross_entropy_forward", rows, classes);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "cross_entropy_forward");
    const std::size_t bytes = cuda::cross_entropy_forward_workspace_bytes(rows);
    cuda::cross_entropy_forward(logits, targets, rows, classes, loss,
                                cuda.workspace(bytes, "cross_entropy_forward"), bytes,
                                cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "cross_entropy_forward",
                  [=] { cpu::cross_entropy_forward(logits, targets, rows, classes, loss); });
}

void cross_entropy_backward(Stream& stream, const float* logits, const std::int32_t* targets,
                            std::int64_t rows, std::int64_t classes, float scale, float* dlogits) {
  check_shape("cross_entropy_backward", rows, classes);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::cross_entropy_backward(logits, targets, rows, classes, scale, dlogits,
                                 cuda::stream_handle(stream, "cross_entropy_backward"));
    return;
  }
#endif
  dispatch_kernel(stream, "cross_entropy_backward", [=] {
    cpu::cross_entropy_backward(logits, targets, rows, classes, scale, dlogits);
  });
}

}  // namespace zest
