#include "kernels/attention_cuda.h"

#include <climits>
#include <cmath>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/launch_cuda.cuh"
#include "kernels/matmul_cuda.h"
#include "kernels/reduce_cuda.cuh"

namespace zest::cuda {
namespace {

constexpr unsigned kRowsPerBlock = 8;  // one warp per row of scores, 256 threads

void check_shape(const char* kernel, const AttentionShape& s) {
  if (s.batch < 1 || s.seq < 1 || s.heads < 1 || s.head_dim < 1 ||
      s.batch * s.heads > INT_MAX || s.seq > INT_MAX || s.head_dim > INT_MAX) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + " (CUDA): needs batch, seq, heads and " +
                                       "head_dim >= 1 (batch * heads, seq, head_dim < 2^31), got " +
                                       std::to_string(s.batch) + ", " + std::to_string(s.seq) +
                                       ", " + std::to_string(s.heads) + ", " +
                                       std::to_string(s.head_dim));
  }
}

std::size_t head_elements(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.heads * s.seq * s.head_dim);
}

// Between `parts` packed [batch, seq, parts·C] rows and `parts` tensors [batch, heads, seq, d]
// end to end: to_heads copies packed -> heads (split), else heads -> packed (merge).
__global__ void permute_kernel(const float* __restrict__ from, float* __restrict__ to,
                               std::int64_t batch, std::int64_t seq, std::int64_t heads,
                               std::int64_t d, int parts, bool to_heads) {
  const std::size_t part_size = static_cast<std::size_t>(batch * heads * seq * d);
  const std::size_t count = part_size * parts;
  const std::int64_t C = heads * d;
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    const auto p = static_cast<std::int64_t>(i / part_size);
    auto rest = static_cast<std::int64_t>(i % part_size);
    const std::int64_t e = rest % d;
    rest /= d;
    const std::int64_t t = rest % seq;
    rest /= seq;
    const std::int64_t h = rest % heads;
    const std::int64_t b = rest / heads;
    const auto packed = static_cast<std::size_t>((b * seq + t) * parts * C + p * C + h * d + e);
    if (to_heads) {
      to[i] = from[packed];
    } else {
      to[packed] = from[i];
    }
  }
}

void permute(const AttentionShape& s, int parts, const float* from, float* to, bool to_heads,
             cudaStream_t stream) {
  permute_kernel<<<block_count(head_elements(s) * parts), kThreadsPerBlock, 0, stream>>>(
      from, to, s.batch, s.seq, s.heads, s.head_dim, parts, to_heads);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

// Row i of each [seq, seq] matrix: softmax over columns j <= i, zeros beyond (the CPU's
// causal_softmax, with the sums in a warp's order).
__global__ void causal_softmax_kernel(float* scores, std::int64_t rows, std::int64_t seq) {
  const std::int64_t r = warp_row(kRowsPerBlock);
  if (r >= rows) return;
  const unsigned lane = threadIdx.x % kWarpSize;
  const std::int64_t i = r % seq;
  float* row = scores + r * seq;
  float max = -INFINITY;
  for (std::int64_t j = lane; j <= i; j += kWarpSize) max = fmaxf(max, row[j]);
  max = warp_max(max);
  float sum = 0.0f;
  for (std::int64_t j = lane; j <= i; j += kWarpSize) {
    row[j] = expf(row[j] - max);
    sum += row[j];
  }
  const float inv = 1.0f / warp_sum(sum);
  for (std::int64_t j = lane; j < seq; j += kWarpSize) row[j] = j <= i ? row[j] * inv : 0.0f;
}

// dS = P ⊙ (dP - rowsum(P ⊙ dP)) over j <= i, 0 beyond (P is 0 there: no gradient leaks to the
// future), in place on dP.
__global__ void causal_softmax_backward_kernel(const float* __restrict__ probs,
                                               float* __restrict__ dp, std::int64_t rows,
                                               std::int64_t seq) {
  const std::int64_t r = warp_row(kRowsPerBlock);
  if (r >= rows) return;
  const unsigned lane = threadIdx.x % kWarpSize;
  const std::int64_t i = r % seq;
  const float* prow = probs + r * seq;
  float* drow = dp + r * seq;
  float dot = 0.0f;
  for (std::int64_t j = lane; j <= i; j += kWarpSize) dot += prow[j] * drow[j];
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < seq; j += kWarpSize) {
    drow[j] = j <= i ? prow[j] * (drow[j] - dot) : 0.0f;
  }
}

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Row-major C_i = alpha op(A_i) op(B_i) for `batch` matrices `stride_*` floats apart, through
// the GEMM of kernels/matmul_cuda.h (cuBLASLt, plain fp32).
struct Batched {
  const MatmulContext& context;
  std::int64_t batch;
  cudaStream_t stream;
  void operator()(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t stride_a, const float* b,
                  std::int64_t stride_b, float* c, std::int64_t stride_c) const {
    MatmulArgs args;
    args.trans_a = trans_a;
    args.trans_b = trans_b;
    args.m = m;
    args.n = n;
    args.k = k;
    args.alpha = alpha;
    args.a = a;
    args.b = b;
    args.d = c;
    args.batch = batch;
    args.stride_a = stride_a;
    args.stride_b = stride_b;
    args.stride_d = stride_c;
    matmul(args, context, stream);
  }
};

}  // namespace

std::size_t attention_backward_scratch_elements(const AttentionShape& s) {
  check_shape("attention_backward", s);
  return s.cuda_backward_scratch_elements();
}

void attention_forward(const MatmulContext& context, const AttentionShape& s, const float* qkv,
                       float* split, float* probs, float* y, float* scratch,
                       cudaStream_t stream) {
  check_shape("attention_forward", s);
  const std::int64_t T = s.seq;
  const std::int64_t d = s.head_dim;
  const std::size_t part = head_elements(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));  // the CPU body's, on the host
  const Batched gemm{context, s.batch * s.heads, stream};
  permute(s, 3, qkv, split, true, stream);
  const float* q = split;
  const float* k = split + part;
  const float* v = split + 2 * part;
  gemm(false, true, T, T, d, scale, q, T * d, k, T * d, probs, T * T);  // S = Q Kᵀ / √d
  const std::int64_t rows = s.batch * s.heads * T;
  causal_softmax_kernel<<<row_blocks(rows), kRowsPerBlock * kWarpSize, 0, stream>>>(probs, rows, T);
  ZEST_CUDA_CHECK(cudaGetLastError());
  gemm(false, false, T, d, T, 1.0f, probs, T * T, v, T * d, scratch, T * d);  // Y = P V
  permute(s, 1, scratch, y, false, stream);
}

void attention_backward(const MatmulContext& context, const AttentionShape& s, const float* dy,
                        const float* split, const float* probs, float* dqkv, float* scratch,
                        cudaStream_t stream) {
  check_shape("attention_backward", s);
  const std::int64_t T = s.seq;
  const std::int64_t d = s.head_dim;
  const std::size_t part = head_elements(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Batched gemm{context, s.batch * s.heads, stream};
  const float* q = split;
  const float* k = split + part;
  const float* v = split + 2 * part;
  float* dy_heads = scratch;
  float* dq = scratch + part;  // dQ | dK | dV, [batch, heads, seq, d] each
  float* dk = dq + part;
  float* dv = dk + part;
  float* dp = scratch + 4 * part;  // [batch, heads, seq, seq]
  permute(s, 1, dy, dy_heads, true, stream);
  gemm(false, true, T, T, d, 1.0f, dy_heads, T * d, v, T * d, dp, T * T);     // dP = dY Vᵀ
  gemm(true, false, T, d, T, 1.0f, probs, T * T, dy_heads, T * d, dv, T * d);  // dV = Pᵀ dY
  const std::int64_t rows = s.batch * s.heads * T;
  causal_softmax_backward_kernel<<<row_blocks(rows), kRowsPerBlock * kWarpSize, 0, stream>>>(
      probs, dp, rows, T);
  ZEST_CUDA_CHECK(cudaGetLastError());
  gemm(false, false, T, d, T, scale, dp, T * T, k, T * d, dq, T * d);  // dQ = dS K / √d
  gemm(true, false, T, d, T, scale, dp, T * T, q, T * d, dk, T * d);   // dK = dSᵀ Q / √d
  permute(s, 3, dq, dqkv, false, stream);
}

}  // namespace zest::cuda
