#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "kernels/dispatch.h"
#include "kernels/matmul.h"
#include "kernels/softmax_row.h"

#if ZEST_HAVE_CUDA
#include "kernels/attention_cuda.h"
#include "kernels/matmul_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_shape(const char* kernel, const AttentionShape& s) {
  if (s.batch < 1 || s.seq < 1 || s.heads < 1 || s.head_dim < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": needs batch, seq, heads and " +
                                       "head_dim >= 1, got " + std::to_string(s.batch) + ", " +
                                       std::to_string(s.seq) + ", " + std::to_string(s.heads) +
                                       ", " + std::to_string(s.head_dim));
  }
}

// Elements of one [batch, heads, seq, head_dim] tensor (= batch · seq · C).
std::size_t head_elements(const AttentionShape& s) {
  return static_cast<std::size_t>(s.batch * s.heads * s.seq * s.head_dim);
}

// Calls copy(packed_offset, heads_offset) for every head row: `parts` packed [batch, seq,
// parts·C] rows against `parts` tensors [batch, heads, seq, d] laid end to end.
template <typename Copy>
void for_each_head_row(const AttentionShape& s, int parts, Copy&& copy) {
  const std::int64_t d = s.head_dim;
  const std::int64_t C = s.channels();
  const std::size_t part_size = head_elements(s);
  for (int p = 0; p < parts; ++p) {
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t h = 0; h < s.heads; ++h) {
        for (std::int64_t t = 0; t < s.seq; ++t) {
          copy(static_cast<std::size_t>((b * s.seq + t) * parts * C + p * C + h * d),
               p * part_size + static_cast<std::size_t>(((b * s.heads + h) * s.seq + t) * d));
        }
      }
    }
  }
}

void split_heads(const AttentionShape& s, int parts, const float* packed, float* heads) {
  const std::int64_t d = s.head_dim;
  for_each_head_row(s, parts, [&](std::size_t from, std::size_t to) {
    std::copy(packed + from, packed + from + d, heads + to);
  });
}

void merge_heads(const AttentionShape& s, int parts, const float* heads, float* packed) {
  const std::int64_t d = s.head_dim;
  for_each_head_row(s, parts, [&](std::size_t to, std::size_t from) {
    std::copy(heads + from, heads + from + d, packed + to);
  });
}

// Row i of scores [seq, seq] becomes softmax over columns j <= i; columns j > i become 0.
void causal_softmax(float* scores, std::int64_t seq) {
  const CpuBody body = selected_cpu_body();
  for (std::int64_t i = 0; i < seq; ++i) {
    float* row = scores + i * seq;
    cpu::softmax_row(body, row, i + 1, row);
    std::fill(row + i + 1, row + seq, 0.0f);
  }
}

}  // namespace

std::size_t AttentionShape::split_elements() const { return 3 * head_elements(*this); }
std::size_t AttentionShape::probs_elements() const {
  return static_cast<std::size_t>(batch * heads * seq * seq);
}
std::size_t AttentionShape::forward_scratch_elements() const { return head_elements(*this); }
std::size_t AttentionShape::backward_scratch_elements() const {
  return 4 * head_elements(*this) + static_cast<std::size_t>(seq * seq);
}
std::size_t AttentionShape::cuda_backward_scratch_elements() const {
  return 4 * head_elements(*this) + probs_elements();
}
std::size_t AttentionShape::cuda_stream_scratch_bytes(bool backward) const {
  if (!backward) return kCudaMatmulWorkspaceBytes;
  return (cuda_backward_scratch_elements() * sizeof(float) + 255) / 256 * 256 +
         kCudaMatmulWorkspaceBytes;
}

namespace cpu {

void attention_forward(const AttentionShape& s, const float* qkv, float* split, float* probs,
                       float* y, float* scratch) {
  check_shape("attention_forward", s);
  const std::int64_t T = s.seq;
  const std::int64_t d = s.head_dim;
  const std::size_t part = head_elements(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  split_heads(s, 3, qkv, split);
  float* y_heads = scratch;
  for (std::int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const float* q = split + bh * T * d;
    const float* k = split + part + bh * T * d;
    const float* v = split + 2 * part + bh * T * d;
    float* p = probs + bh * T * T;
    // Note: the full T x T product is taken and the upper triangle masked after; one GEMM call
    // beats T short ones at these sizes.
    matmul(false, true, T, T, d, scale, q, k, 0.0f, p);
    causal_softmax(p, T);
    matmul(false, false, T, d, T, 1.0f, p, v, 0.0f, y_heads + bh * T * d);
  }
  merge_heads(s, 1, y_heads, y);
}

void attention_backward(const AttentionShape& s, const float* dy, const float* split,
                        const float* probs, float* dqkv, float* scratch) {
  check_shape("attention_backward", s);
  const std::int64_t T = s.seq;
  const std::int64_t d = s.head_dim;
  const std::size_t part = head_elements(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* dy_heads = scratch;
  float* dsplit = scratch + part;  // dQ | dK | dV, [batch, heads, seq, d] each
  float* dp = scratch + 4 * part;  // [T, T], one (batch, head) at a time
  split_heads(s, 1, dy, dy_heads);
  for (std::int64_t bh = 0; bh < s.batch * s.heads; ++bh) {
    const std::int64_t at = bh * T * d;
    const float* q = split + at;
    const float* k = split + part + at;
    const float* v = split + 2 * part + at;
    const float* p = probs + bh * T * T;
    const float* dyh = dy_heads + at;
    matmul(false, true, T, T, d, 1.0f, dyh, v, 0.0f, dp);                 // dP = dY Vᵀ
    matmul(true, false, T, d, T, 1.0f, p, dyh, 0.0f, dsplit + 2 * part + at);  // dV = Pᵀ dY
    // Softmax backward, row by row: dS = P ⊙ (dP - rowsum(P ⊙ dP)). Masked entries have P = 0,
    // so their dS is 0 and no gradient leaks to future positions.
    for (std::int64_t i = 0; i < T; ++i) {
      const float* prow = p + i * T;
      float* drow = dp + i * T;
      float dot = 0.0f;
      for (std::int64_t j = 0; j <= i; ++j) dot += prow[j] * drow[j];
      for (std::int64_t j = 0; j <= i; ++j) drow[j] = prow[j] * (drow[j] - dot);
      std::fill(drow + i + 1, drow + T, 0.0f);
    }
    matmul(false, false, T, d, T, scale, dp, k, 0.0f, dsplit + at);         // dQ = dS K / √d
    matmul(true, false, T, d, T, scale, dp, q, 0.0f, dsplit + part + at);  // dK = dSᵀ Q / √d
  }
  merge_heads(s, 3, dsplit, dqkv);
}

}  // namespace cpu

void attention_forward(Stream& stream, const AttentionShape& shape, const float* qkv,
                       float* split, float* probs, float* y, float* scratch) {
  check_shape("attention_forward", shape);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "attention_forward");
    const cuda::MatmulContext context = cuda::stream_matmul_context(cuda, "attention_forward");
    cuda::attention_forward(context, shape, qkv, split, probs, y, scratch, cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "attention_forward", [=] {
    cpu::attention_forward(shape, qkv, split, probs, y, scratch);
  });
}

void attention_backward(Stream& stream, const AttentionShape& shape, const float* dy,
                        const float* split, const float* probs, float* dqkv, float* scratch) {
  check_shape("attention_backward", shape);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "attention_backward");
    // Note: the CUDA body needs more scratch than the caller's (every pair's dP at once), and a
    // launch has one workspace region (a larger request frees the old one), so the scratch and
    // the GEMM's workspace are carved from one request: the scratch first, its bytes rounded up
    // to a multiple of 256 so that the GEMM's part starts 256-byte aligned as cuBLASLt prefers.
    const std::size_t scratch_bytes =
        (cuda::attention_backward_scratch_elements(shape) * sizeof(float) + 255) / 256 * 256;
    auto* workspace = static_cast<unsigned char*>(
        cuda.workspace(shape.cuda_stream_scratch_bytes(true), "attention_backward"));
    const cuda::MatmulContext context{cuda.blas_handle(), workspace + scratch_bytes,
                                      cuda::kMatmulWorkspaceBytes, cuda.fp32_matmul_rounding()};
    cuda::attention_backward(context, shape, dy, split, probs, dqkv,
                             reinterpret_cast<float*>(workspace), cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "attention_backward", [=] {
    cpu::attention_backward(shape, dy, split, probs, dqkv, scratch);
  });
}

}  // namespace zest
