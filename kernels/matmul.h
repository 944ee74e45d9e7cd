// Row-major fp32 matrix multiply, C = alpha * op(A) * op(B) + beta * C, with op(X) = X or X^T:
// op(A) is m x k, op(B) is k x n, C is m x n, all contiguous row-major. The CPU body is
// OpenBLAS's cblas_sgemm; OpenBLAS's own thread count is a process-wide choice that belongs to
// whoever owns the process (the world: openblas_set_num_threads(1) when ranks run as threads),
// never to this kernel. Invariant: with beta == 0, C's old contents are not read.
#pragma once

#include <cstdint>

#include "runtime/stream.h"

namespace zest {

namespace cpu {

// Synchronous body. Throws a kUsage Error for a negative or too large (> INT_MAX) dimension.
void matmul(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c);

}  // namespace cpu

// Enqueues the multiply on `stream`. Dimensions are checked here, on the host.
void matmul(Stream& stream, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
            std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c);

}  // namespace zest
