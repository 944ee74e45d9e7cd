// CUDA bodies of kernels/embedding.h: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], and a
// backward that is deterministic and bit-identical to the CPU body: wpe's rows sum the batch in
// order, and wte's rows are summed per token over the token's positions in position order (a
// stable CUB radix sort of the tokens groups them; no float atomics). Backward ACCUMULATES into
// dwte and dwpe. Differences from the CPU body, since a kernel cannot throw: a token outside
// [0, vocab) makes its output row NaN in forward and adds nothing in backward.
// CUDA-side only: include it from .cu files and *_cuda.cc sources.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "kernels/embedding_cuda.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace zest::cuda {

// Device pointers, shapes as cpu::embedding_forward. Throws kUsage unless every dimension is
// >= 1 and batch * seq < 2^31.
void embedding_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                       const float* wte, const float* wpe, std::int64_t vocab,
                       std::int64_t channels, float* out, cudaStream_t stream);

// Workspace bytes embedding_backward needs for batch * seq tokens (the sort's arrays and CUB's
// temporary storage). Asks the current device; throws kDevice if CUDA fails.
std::size_t embedding_backward_workspace_bytes(std::int64_t batch, std::int64_t seq);

void embedding_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                        const float* dout, std::int64_t vocab, std::int64_t channels, float* dwte,
                        float* dwpe, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream);

// kernels/embedding.h's vocabulary pieces: the rows [row_begin, row_begin + rows) of wte in a
// table of their own; wpe or in is the base (see there). Backward's workspace is
// embedding_backward_workspace_bytes(batch, seq); dwpe may be null.
void embedding_rows_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                            const float* rows_table, std::int64_t row_begin, std::int64_t rows,
                            const float* wpe, const float* in, std::int64_t vocab,
                            std::int64_t channels, float* out, cudaStream_t stream);
void embedding_rows_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                             const float* dout, std::int64_t row_begin, std::int64_t rows,
                             std::int64_t vocab, std::int64_t channels, float* drows, float* dwpe,
                             void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace zest::cuda
