#include "kernels/cross_entropy_pieces.h"

#include <cmath>
#include <limits>
#include <string>

#include "base/error.h"
#include "kernels/cross_entropy_body.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/cross_entropy_pieces_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_piece(const char* kernel, std::int64_t rows, std::int64_t begin, std::int64_t cols,
                 std::int64_t classes, std::int64_t ld, std::int64_t ldd) {
  if (rows < 1 || begin < 0 || cols < 1 || begin + cols > classes || ld < cols || ldd < cols) {
    throw Error(ErrorKind::kUsage,
                std::string(kernel) + ": needs rows >= 1, a piece [begin, begin + cols) inside " +
                    "[0, " + std::to_string(classes) +
                    ") and leading dimensions >= cols, got rows " +
                    std::to_string(rows) + ", piece [" + std::to_string(begin) + ", " +
                    std::to_string(begin + cols) + "), ld " + std::to_string(ld) + " and " +
                    std::to_string(ldd));
  }
}

// The running state's three arrays (cross_entropy_running_bytes): the doubles first, so that
// every array is aligned.
struct Running {
  double* sum;
  float* max;
  float* target_logit;
};
Running running_of(void* running, std::int64_t rows) {
  double* sum = static_cast<double*>(running);
  float* max = reinterpret_cast<float*>(sum + rows);
  return {sum, max, max + rows};
}

}  // namespace

namespace cpu {

void cross_entropy_piece_forward(CpuBody body, const float* piece, std::int64_t ld,
                                 const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t begin, std::int64_t cols, std::int64_t classes,
                                 void* running) {
  check_piece("cross_entropy_piece_forward", rows, begin, cols, classes, ld, cols);
  const RowBody run = row_body(body);
  const Running state = running_of(running, rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t target = targets[r];
    if (begin == 0) {
      if (target < 0 || target >= classes) {
        throw Error(ErrorKind::kData, "cross_entropy: target of row " + std::to_string(r) +
                                          " is " + std::to_string(target) + ", outside [0, " +
                                          std::to_string(classes) + ")");
      }
      state.sum[r] = 0.0;
      state.max[r] = -std::numeric_limits<float>::infinity();
    }
    const float* row = piece + r * ld;
    const float piece_max = run.max(row, cols);
    const float old_max = state.max[r];
    const float max = old_max > piece_max ? old_max : piece_max;
    // The sum so far was taken against old_max: rescale it to the new max (exact when equal).
    const double rescale =
        old_max == max ? 1.0 : std::exp(static_cast<double>(old_max) - static_cast<double>(max));
    state.sum[r] = state.sum[r] * rescale + run.exp_sum(row, cols, max);
    state.max[r] = max;
    if (target >= begin && target < begin + cols) state.target_logit[r] = row[target - begin];
  }
}

void cross_entropy_pieces_finish(const void* running, std::int64_t rows, float* lse, float* loss) {
  const Running state = running_of(const_cast<void*>(running), rows);
  double total = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    // -log softmax[target] = max + log(sum exp(x - max)) - x[target]
    const double row_lse = static_cast<double>(state.max[r]) + std::log(state.sum[r]);
    total += row_lse - static_cast<double>(state.target_logit[r]);
    lse[r] = static_cast<float>(row_lse);
  }
  *loss = static_cast<float>(total / static_cast<double>(rows));
}

void cross_entropy_piece_backward(CpuBody body, const float* piece, std::int64_t ld,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t begin, std::int64_t cols, const float* lse,
                                  float scale, float* dpiece, std::int64_t ldd) {
  check_piece("cross_entropy_piece_backward", rows, begin, cols, begin + cols, ld, ldd);
  const RowBody run = row_body(body);
  const float row_scale = scale / static_cast<float>(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    // exp(x - lse) is the softmax: lse already holds the log of the row's sum.
    run.softmax(piece + r * ld, cols, lse[r], 1.0f, row_scale, dpiece + r * ldd);
    const std::int32_t target = targets[r];
    if (target >= begin && target < begin + cols) dpiece[r * ldd + (target - begin)] -= row_scale;
  }
}

}  // namespace cpu

void cross_entropy_piece_forward(Stream& stream, const float* piece, std::int64_t ld,
                                 const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t begin, std::int64_t cols, std::int64_t classes,
                                 void* running) {
  check_piece("cross_entropy_piece_forward", rows, begin, cols, classes, ld, cols);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::cross_entropy_piece_forward(piece, ld, targets, rows, begin, cols, classes, running,
                                      cuda::stream_handle(stream, "cross_entropy_piece_forward"));
    return;
  }
#endif
  dispatch_kernel(stream, "cross_entropy_piece_forward", [=] {
    cpu::cross_entropy_piece_forward(selected_cpu_body(), piece, ld, targets, rows, begin, cols,
                                     classes, running);
  });
}

void cross_entropy_pieces_finish(Stream& stream, const void* running, std::int64_t rows,
                                 float* lse, float* loss) {
  if (rows < 1) {
    throw Error(ErrorKind::kUsage,
                "cross_entropy_pieces_finish: needs rows >= 1, got " + std::to_string(rows));
  }
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::cross_entropy_pieces_finish(running, rows, lse, loss,
                                      cuda::stream_handle(stream, "cross_entropy_pieces_finish"));
    return;
  }
#endif
  dispatch_kernel(stream, "cross_entropy_pieces_finish",
                  [=] { cpu::cross_entropy_pieces_finish(running, rows, lse, loss); });
}

void cross_entropy_piece_backward(Stream& stream, const float* piece, std::int64_t ld,
                                  const std::int32_t* targets, std::int64_t rows,
                                  std::int64_t begin, std::int64_t cols, const float* lse,
                                  float scale, float* dpiece, std::int64_t ldd) {
  check_piece("cross_entropy_piece_backward", rows, begin, cols, begin + cols, ld, ldd);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::cross_entropy_piece_backward(piece, ld, targets, rows, begin, cols, lse, scale, dpiece,
                                       ldd,
                                       cuda::stream_handle(stream, "cross_entropy_piece_backward"));
    return;
  }
#endif
  dispatch_kernel(stream, "cross_entropy_piece_backward", [=] {
    cpu::cross_entropy_piece_backward(selected_cpu_body(), piece, ld, targets, rows, begin, cols,
                                      lse, scale, dpiece, ldd);
  });
}

}  // namespace zest
