// Row-major fp32 matrix multiply, C = alpha * op(A) * op(B) + beta * C, with op(X) = X or X^T:
// op(A) is m x k, op(B) is k x n, C is m x n, all contiguous row-major. The CPU body is
// OpenBLAS's cblas_sgemm; OpenBLAS's own thread count is a process-wide choice that belongs to
// whoever owns the process (the world: openblas_set_num_threads(1) when ranks run as threads),
// never to this kernel. The CPU body runs at most as many products of 4M multiply-adds or more at
// once, process-wide, as the process may use cores (ZEST_CONCURRENT_PRODUCTS=n: n, 0: no limit);
// a caller past that waits.
// Invariant: with beta == 0, C's old contents are not read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "runtime/stream.h"

namespace zest {

// The scratch a CUDA stream keeps for its products (cuBLASLt's recommendation for Hopper; the
// workspace bounds which algorithms it may pick). Here, not in matmul_cuda.h, because the memory
// planner counts it for CUDA devices in builds without CUDA too.
inline constexpr std::size_t kCudaMatmulWorkspaceBytes = std::size_t{32} << 20;

namespace cpu {

// Synchronous body. Throws a kUsage Error for a negative or too large (> INT_MAX) dimension.
void matmul(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
            const float* a, const float* b, float beta, float* c);
// The same with the leading dimensions of the stored row-major matrices (elements from one row
// to the next; at least their row length): a product on a block of columns of a wider matrix.
void matmul_ld(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
               float beta, float* c, std::int64_t ldc);

}  // namespace cpu

// How the fp32 products on `stream` treat their inputs from now on: kFloat32 (the default)
// multiplies them exactly; kBFloat16 / kFloat16 lets the GPU round them to that type for its
// tensor cores, accumulating in fp32 (torch.set_float32_matmul_precision("medium"), or what
// autocast does to a product's inputs). The CUDA device's products and attention's follow it;
// the CPU device always multiplies exactly (OpenBLAS has no such mode), so this is a no-op
// there. Throws kUsage for another type.
void set_fp32_matmul_rounding(Stream& stream, DType rounding);

// Enqueues the multiply on `stream`. Dimensions are checked here, on the host.
void matmul(Stream& stream, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
            std::int64_t k, float alpha, const float* a, const float* b, float beta, float* c);
// With leading dimensions (cpu::matmul_ld): the vocabulary pieces' products write and read
// their columns of the [N, V] logits in place. Throws kUsage, on the host, for a leading
// dimension below its stored row length or above INT_MAX.
void matmul_ld(Stream& stream, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
               std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
               std::int64_t ldb, float beta, float* c, std::int64_t ldc);

}  // namespace zest
