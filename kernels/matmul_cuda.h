// CUDA body of the row-major matrix multiply of kernels/matmul.h, through cuBLASLt:
// D = alpha * op(A) * op(B) + beta * C (+ bias) (then GELU), op(A) m x k, op(B) k x n, C and D
// m x n, all contiguous row-major as on the CPU. fp32 inputs compute in plain fp32
// (CUBLAS_COMPUTE_32F, never TF32: the CPU parity holds 1e-5); bf16 / fp16 inputs accumulate in
// fp32 and write fp32 or their own type. The epilogues fuse the GPT's neighbours of a product:
// the bias add, a residual (C is another buffer than D), and bias + GELU keeping the pre-GELU
// values for backward. A strided batch runs many same-shaped products in one call (attention's
// (batch, head) pairs). Invariant: the handle and workspace are the caller's, made once outside
// the step; nothing is allocated here.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/matmul_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "base/dtype.h"
#include "kernels/matmul.h"

namespace zest::cuda {

// cuBLASLt's recommendation for Hopper; the workspace bounds which algorithms it may pick.
inline constexpr std::size_t kMatmulWorkspaceBytes = kCudaMatmulWorkspaceBytes;

// What a multiply needs besides its operands: a cuBLASLt handle and a device workspace (a view
// into a buffer an allocator owns, charged to `workspace`), both the caller's.
struct MatmulContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // fp32 inputs only: kFloat32 multiplies them exactly (CUBLAS_COMPUTE_32F); kBFloat16 / kFloat16
  // lets cuBLAS round them to that type for the tensor cores, accumulating in fp32
  // (CUBLAS_COMPUTE_32F_FAST_16BF / _16F): the stream's setting (kernels/matmul.h).
  DType fp32_rounding = DType::kFloat32;
};

class CudaStream;
// The context of a product on `stream`: its cuBLASLt handle, its scratch grown to
// kMatmulWorkspaceBytes (charged to workspace; `kernel` names the caller in errors), its rounding.
// Defined in kernels/matmul.cc.
MatmulContext stream_matmul_context(CudaStream& stream, const char* kernel);

enum class MatmulEpilogue {
  kNone,
  kBias,      // D = alpha op(A) op(B) + beta C + bias (bias: [n], broadcast over rows)
  kGeluBias,  // pre = alpha op(A) op(B) + beta C + bias; D = gelu(pre); gelu_input = pre
};

struct MatmulArgs {
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  float alpha = 1.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  DType input_type = DType::kFloat32;  // of A and B: fp32, bf16 or fp16
  float beta = 0.0f;
  // Read only when beta != 0; nullptr means D (in place, as the CPU's C). A residual: D = C + ...
  const void* c = nullptr;
  void* d = nullptr;
  DType output_type = DType::kFloat32;  // of C, D, bias and gelu_input; fp32 for fp32 inputs
  MatmulEpilogue epilogue = MatmulEpilogue::kNone;
  const void* bias = nullptr;  // [n], for kBias and kGeluBias
  void* gelu_input = nullptr;  // [m, n], written by kGeluBias: what gelu_backward takes as x
  // `batch` products, product i on a + i * stride_a elements, b + i * stride_b, and C and D
  // + i * stride_d (C is D's shape). 1: a single product, the strides unused. No epilogue with
  // batch > 1.
  std::int64_t batch = 1;
  std::int64_t stride_a = 0;
  std::int64_t stride_b = 0;
  std::int64_t stride_d = 0;
  // Leading dimensions of the stored row-major A, B and C/D (elements from one row to the next);
  // 0: contiguous (the stored row length). A block of columns of a wider matrix: the vocabulary
  // pieces' logits.
  std::int64_t lda = 0;
  std::int64_t ldb = 0;
  std::int64_t ldd = 0;
};

// Enqueues the multiply on `stream`. Throws, on the host, a kUsage Error for m or n outside
// [0, 2^31), k outside [1, 2^31), batch outside [1, 2^31) or negative strides, an epilogue with
// batch > 1, an unsupported type pair, a missing bias / gelu_input, or kGeluBias with n not a
// multiple of 8 (cuBLASLt's rule for the pre-GELU matrix), and kDevice
// when cuBLASLt fails or has no algorithm for the shape within the workspace. m == 0 or n == 0
// does nothing. Operands may sit at any element offset: the algorithm is chosen for the
// pointers' (and the batch strides') actual alignment.
void matmul(const MatmulArgs& args, const MatmulContext& context, cudaStream_t stream);

// matmul, but where cuBLASLt has no algorithm for the operands it returns false, having queued
// nothing, instead of throwing: for a caller with another way to the same result (an epilogue's
// bias and GELU as kernels of their own). Every other error throws as matmul's does.
bool try_matmul(const MatmulArgs& args, const MatmulContext& context, cudaStream_t stream);

}  // namespace zest::cuda
