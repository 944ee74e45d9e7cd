#include "kernels/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/vocab_parallel_cross_entropy_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {

namespace {

void check_shape(const char* kernel, std::int64_t rows, std::int64_t cols) {
  if (rows < 1 || cols < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": rows and cols must be >= 1, got " +
                                       std::to_string(rows) + " x " + std::to_string(cols));
  }
}

}  // namespace

namespace cpu {

void vocab_parallel_row_max(const float* logits, std::int64_t rows, std::int64_t cols,
                            float* max_out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * cols;
    max_out[r] = *std::max_element(row, row + cols);
  }
}

void vocab_parallel_partials(const float* logits, const std::int32_t* targets, std::int64_t rows,
                             std::int64_t cols, std::int64_t begin, std::int64_t classes,
                             const float* gathered_max, int group, float* max_out, float* partial) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t target = targets[r];
    if (target < 0 || target >= classes) {
      throw Error(ErrorKind::kData, "cross-entropy: target " + std::to_string(target) + " at row " +
                                        std::to_string(r) + " is outside [0, " +
                                        std::to_string(classes) + ")");
    }
    float max = gathered_max[r];
    for (int g = 1; g < group; ++g) max = std::max(max, gathered_max[g * rows + r]);
    max_out[r] = max;
    // Note: the exp-sum in double, as one rank's share of a sum the group adds up.
    const float* row = logits + r * cols;
    double sum = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(row[c] - max));
    partial[r] = static_cast<float>(sum);
    const std::int64_t local = target - begin;
    partial[rows + r] = local >= 0 && local < cols ? row[local] : 0.0f;
  }
}

void vocab_parallel_finish(const float* max, const float* summed_partial, std::int64_t rows,
                           float* lse, float* loss) {
  double total = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    lse[r] = max[r] + std::log(summed_partial[r]);
    total += static_cast<double>(lse[r]) - static_cast<double>(summed_partial[rows + r]);
  }
  *loss = static_cast<float>(total / static_cast<double>(rows));
}

void vocab_parallel_cross_entropy_backward(const float* logits, const std::int32_t* targets,
                                           std::int64_t rows, std::int64_t cols, std::int64_t begin,
                                           const float* lse, float scale, float* dlogits) {
  const float factor = scale / static_cast<float>(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * cols;
    float* out = dlogits + r * cols;
    const std::int64_t local = targets[r] - begin;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float probability = std::exp(row[c] - lse[r]);
      out[c] = (probability - (c == local ? 1.0f : 0.0f)) * factor;
    }
  }
}

}  // namespace cpu

void vocab_parallel_row_max(Stream& stream, const float* logits, std::int64_t rows,
                            std::int64_t cols, float* max_out) {
  check_shape("vocab_parallel_row_max", rows, cols);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::vocab_parallel_row_max(logits, rows, cols, max_out,
                                 cuda::stream_handle(stream, "vocab_parallel_row_max"));
    return;
  }
#endif
  dispatch_kernel(stream, "vocab_parallel_row_max",
                  [=] { cpu::vocab_parallel_row_max(logits, rows, cols, max_out); });
}

void vocab_parallel_partials(Stream& stream, const float* logits, const std::int32_t* targets,
                             std::int64_t rows, std::int64_t cols, std::int64_t begin,
                             std::int64_t classes, const float* gathered_max, int group,
                             float* max_out, float* partial) {
  check_shape("vocab_parallel_partials", rows, cols);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::vocab_parallel_partials(logits, targets, rows, cols, begin, classes, gathered_max, group,
                                  max_out, partial,
                                  cuda::stream_handle(stream, "vocab_parallel_partials"));
    return;
  }
#endif
  dispatch_kernel(stream, "vocab_parallel_partials", [=] {
    cpu::vocab_parallel_partials(logits, targets, rows, cols, begin, classes, gathered_max, group,
                                 max_out, partial);
  });
}

void vocab_parallel_finish(Stream& stream, const float* max, const float* summed_partial,
                           std::int64_t rows, float* lse, float* loss) {
  check_shape("vocab_parallel_finish", rows, 1);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::vocab_parallel_finish(max, summed_partial, rows, lse, loss,
                                cuda::stream_handle(stream, "vocab_parallel_finish"));
    return;
  }
#endif
  dispatch_kernel(stream, "vocab_parallel_finish",
                  [=] { cpu::vocab_parallel_finish(max, summed_partial, rows, lse, loss); });
}

void vocab_parallel_cross_entropy_backward(Stream& stream, const float* logits,
                                           const std::int32_t* targets, std::int64_t rows,
                                           std::int64_t cols, std::int64_t begin,
                                           const float* lse, float scale, float* dlogits) {
  check_shape("vocab_parallel_cross_entropy_backward", rows, cols);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::vocab_parallel_cross_entropy_backward(
        logits, targets, rows, cols, begin, lse, scale, dlogits,
        cuda::stream_handle(stream, "vocab_parallel_cross_entropy_backward"));
    return;
  }
#endif
  dispatch_kernel(stream, "vocab_parallel_cross_entropy_backward", [=] {
    cpu::vocab_parallel_cross_entropy_backward(logits, targets, rows, cols, begin, lse, scale,
                                               dlogits);
  });
}

}  // namespace zest
