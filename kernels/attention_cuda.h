// CUDA body of kernels/attention.h's causal multi-head attention, with the CPU body's layouts
// (qkv [batch, seq, 3C] in, y [batch, seq, C] out; split Q | K | V [3][batch, heads, seq, d] and
// probabilities [batch, heads, seq, seq] kept for backward) and math (scores scaled by 1/sqrt(d)
// inside the product, the upper triangle masked after it). The products are strided-batched
// cuBLASLt GEMMs (kernels/matmul_cuda.h) over every (batch, head) pair at once, in fp32 (never
// TF32): exact unless the context's fp32_rounding lets them round their inputs to bf16 / fp16, as
// the dispatch passes the stream's setting; the causal softmax and its backward are one warp per
// row.
// Invariant: backward needs more scratch than the CPU body (every pair's dP at once, not one at a
// time): size it with attention_backward_scratch_elements below, not the AttentionShape member.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/attention_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/attention.h"
#include "kernels/matmul_cuda.h"

namespace zest::cuda {

// Scratch floats of the CUDA backward: dY, dQ, dK, dV per head, then dP for every pair.
std::size_t attention_backward_scratch_elements(const AttentionShape& shape);

// Device pointers, sized as on the CPU (forward scratch: shape.forward_scratch_elements()).
// `context` is the caller's cuBLASLt handle and GEMM workspace (as for matmul). Throw kUsage
// unless every dimension is >= 1 and batch * heads, seq and head_dim are below 2^31; kDevice
// when cuBLASLt fails.
void attention_forward(const MatmulContext& context, const AttentionShape& shape, const float* qkv,
                       float* split, float* probs, float* y, float* scratch, cudaStream_t stream);
void attention_backward(const MatmulContext& context, const AttentionShape& shape, const float* dy,
                        const float* split, const float* probs, float* dqkv, float* scratch,
                        cudaStream_t stream);

}  // namespace zest::cuda
