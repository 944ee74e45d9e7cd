#include "kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "base/error.h"
#include "kernels/cross_entropy_body.h"
#include "kernels/dispatch.h"
#include "kernels/exp_body.h"
#include "kernels/softmax_row.h"

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

}  // namespace

namespace cpu {
namespace {

// max(z, -kExpLimit) that keeps a NaN, as the SIMD bodies' maxps does.
inline float shifted(float x, float max) {
  const float z = x - max;
  return z < -kExpLimit ? -kExpLimit : z;
}

float row_max_portable(const float* row, std::int64_t classes) {
  float lanes[kRowLanes];
  for (float& lane : lanes) lane = -std::numeric_limits<float>::infinity();
  return finish_row_max(lanes, row, 0, classes);
}

double row_exp_sum_portable(const float* row, std::int64_t classes, float max) {
  double lanes[kRowLanes] = {};
  return finish_row_exp_sum(lanes, row, 0, classes, max);
}

void row_softmax_portable(const float* row, std::int64_t classes, float max, float inv_sum,
                          float scale, float* out) {
  softmax_tail(row, 0, classes, max, inv_sum, scale, out);
}

}  // namespace

RowBody row_body(CpuBody body) {
  switch (body) {
#if defined(ZEST_HAVE_X86_BODIES)
    case CpuBody::kAvx512: return {row_max_avx512, row_exp_sum_avx512, row_softmax_avx512};
    case CpuBody::kAvx2: return {row_max_avx2, row_exp_sum_avx2, row_softmax_avx2};
#else
    case CpuBody::kAvx512:
    case CpuBody::kAvx2:
#endif
    case CpuBody::kPortable: break;
  }
  return {row_max_portable, row_exp_sum_portable, row_softmax_portable};
}

// Note: lane l runs (lane > x ? lane : x) over its elements, which is maxps(lane, x); then the
// lanes are folded in index order, the same in every body.
float finish_row_max(float* lanes, const float* row, std::int64_t from, std::int64_t classes) {
  for (std::int64_t j = from; j < classes; ++j) {
    float& lane = lanes[j % kRowLanes];
    lane = lane > row[j] ? lane : row[j];
  }
  float max = lanes[0];
  for (std::int64_t l = 1; l < kRowLanes; ++l) max = max > lanes[l] ? max : lanes[l];
  return max;
}

// The sums are double: a row may have tens of thousands of classes, and the exps are exact in
// double, so only the additions round, in a fixed order: per lane, then the lanes pairwise.
double finish_row_exp_sum(double* lanes, const float* row, std::int64_t from,
                          std::int64_t classes, float max) {
  for (std::int64_t j = from; j < classes; ++j) {
    lanes[j % kRowLanes] += static_cast<double>(exp_clamped(shifted(row[j], max)));
  }
  for (std::int64_t width = kRowLanes / 2; width >= 1; width /= 2) {
    for (std::int64_t l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

void softmax_tail(const float* row, std::int64_t from, std::int64_t classes, float max,
                  float inv_sum, float scale, float* out) {
  for (std::int64_t j = from; j < classes; ++j) {
    out[j] = exp_clamped(shifted(row[j], max)) * inv_sum * scale;
  }
}

void softmax_row(CpuBody body, const float* row, std::int64_t n, float* out) {
  const RowBody run = row_body(body);
  const float max = run.max(row, n);
  const float inv_sum = static_cast<float>(1.0 / run.exp_sum(row, n, max));
  run.softmax(row, n, max, inv_sum, 1.0f, out);
}

void cross_entropy_forward(CpuBody body, const float* logits, const std::int32_t* targets,
                           std::int64_t rows, std::int64_t classes, float* loss) {
  check_shape("cross_entropy_forward", rows, classes);
  const RowBody run = row_body(body);
  double total = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * classes;
    const std::int32_t target = checked_target(targets, r, classes);
    const float max = run.max(row, classes);
    // -log softmax[target] = log(sum exp(x - max)) - (x[target] - max)
    total += std::log(run.exp_sum(row, classes, max)) - static_cast<double>(row[target] - max);
  }
  *loss = static_cast<float>(total / static_cast<double>(rows));
}

void cross_entropy_backward(CpuBody body, const float* logits, const std::int32_t* targets,
                            std::int64_t rows, std::int64_t classes, float scale,
                            float* dlogits) {
  check_shape("cross_entropy_backward", rows, classes);
  const RowBody run = row_body(body);
  const float row_scale = scale / static_cast<float>(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * classes;
    float* drow = dlogits + r * classes;
    const std::int32_t target = checked_target(targets, r, classes);
    const float max = run.max(row, classes);
    const float inv_sum = static_cast<float>(1.0 / run.exp_sum(row, classes, max));
    // Each element is read before it is written, so drow may be row (in place).
    run.softmax(row, classes, max, inv_sum, row_scale, drow);
    drow[target] -= row_scale;
  }
}

void cross_entropy_forward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                           std::int64_t classes, float* loss) {
  cross_entropy_forward(selected_cpu_body(), logits, targets, rows, classes, loss);
}

void cross_entropy_backward(const float* logits, const std::int32_t* targets, std::int64_t rows,
                            std::int64_t classes, float scale, float* dlogits) {
  cross_entropy_backward(selected_cpu_body(), logits, targets, rows, classes, scale, dlogits);
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
