#include "kernels/bias.h"

#include <string>

#include "base/error.h"
#include "kernels/dispatch.h"

namespace zest {
namespace {

void check_shape(const char* kernel, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": negative shape [" +
                                       std::to_string(rows) + ", " + std::to_string(cols) + "]");
  }
}

}  // namespace

namespace cpu {

void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* __restrict row = y + r * cols;
    const float* __restrict b = bias;
    for (std::int64_t j = 0; j < cols; ++j) row[j] += b[j];
  }
}

// Row by row, so dy is read once in memory order and the sums stay in dbias (cache-resident).
void bias_grad(const float* dy, float* dbias, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* __restrict row = dy + r * cols;
    float* __restrict sum = dbias;
    for (std::int64_t j = 0; j < cols; ++j) sum[j] += row[j];
  }
}

}  // namespace cpu

void add_bias(Stream& stream, float* y, const float* bias, std::int64_t rows, std::int64_t cols) {
  check_shape("add_bias", rows, cols);
  if (rows == 0 || cols == 0) return;
  dispatch_kernel(stream, "add_bias", [=] { cpu::add_bias(y, bias, rows, cols); });
}

void bias_grad(Stream& stream, const float* dy, float* dbias, std::int64_t rows,
               std::int64_t cols) {
  check_shape("bias_grad", rows, cols);
  if (rows == 0 || cols == 0) return;
  dispatch_kernel(stream, "bias_grad", [=] { cpu::bias_grad(dy, dbias, rows, cols); });
}

}  // namespace zest
