// Causal multi-head self-attention, y = softmax(Q Kᵀ / sqrt(d) + causal mask) V per head, from
// the packed projection qkv [batch, seq, 3C] (Q | K | V along the last axis, head h in columns
// [h·d, (h+1)·d) of each) to y [batch, seq, C]. Matrix products go through matmul (cblas_sgemm)
// one (batch, head) pair at a time. Forward keeps Q, K, V split per head and the attention
// probabilities for backward; backward WRITES dqkv (an input gradient is made fresh by its
// layer). Invariant: buffers hold the element counts the *_elements() functions give and do not
// overlap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/stream.h"

namespace zest {

struct AttentionShape {
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;

  std::int64_t channels() const { return heads * head_dim; }
  // Q, K and V as [3][batch, heads, seq, head_dim]: kept from forward for backward.
  std::size_t split_elements() const;
  // Attention probabilities [batch, heads, seq, seq]: kept from forward for backward.
  std::size_t probs_elements() const;
  // Scratch of one call.
  std::size_t forward_scratch_elements() const;
  std::size_t backward_scratch_elements() const;
  // The CUDA body's backward scratch: every (batch, head) pair's dP at once, where the CPU body
  // does one pair at a time.
  std::size_t cuda_backward_scratch_elements() const;
  // What a call asks of a CUDA stream's scratch (runtime/cuda_stream.h: one region, grown,
  // never shrunk): the products' workspace, and in backward the scratch above carved before
  // it at a 256-byte boundary. For the memory planner, in every build.
  std::size_t cuda_stream_scratch_bytes(bool backward) const;
};

namespace cpu {

// qkv: [batch, seq, 3C] -> split, probs (kept), y: [batch, seq, C].
void attention_forward(const AttentionShape& shape, const float* qkv, float* split, float* probs,
                       float* y, float* scratch);
// dy: [batch, seq, C] -> dqkv: [batch, seq, 3C] (written), from forward's split and probs.
void attention_backward(const AttentionShape& shape, const float* dy, const float* split,
                        const float* probs, float* dqkv, float* scratch);

}  // namespace cpu

// Throw a kUsage Error, on the host, unless every dimension of `shape` is >= 1. On a CUDA stream
// backward leaves `scratch` alone: it needs more (kernels/attention_cuda.h) and takes it from the
// stream's workspace.
void attention_forward(Stream& stream, const AttentionShape& shape, const float* qkv,
                       float* split, float* probs, float* y, float* scratch);
void attention_backward(Stream& stream, const AttentionShape& shape, const float* dy,
                        const float* split, const float* probs, float* dqkv, float* scratch);

}  // namespace zest
