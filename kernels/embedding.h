// GPT's input embedding: out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :] for int32 tokens
// [batch, seq], a token table wte [vocab, channels] and a position table wpe [>= seq, channels].
// Backward scatters the output gradient into both tables in one fixed order (row-major over
// [batch, seq]), so the sums are deterministic. Invariant: a token outside [0, vocab) is a
// kData Error naming its position [b, t] and value, raised by the body (so on the stream) before
// anything is written (on a CUDA stream, where a kernel cannot throw, its output row is NaN
// instead: kernels/embedding_cuda.h); backward ACCUMULATES into dwte and dwpe.
#pragma once

#include <cstdint>

#include "runtime/stream.h"

namespace zest {

namespace cpu {

void embedding_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                       const float* wte, const float* wpe, std::int64_t vocab,
                       std::int64_t channels, float* out);
void embedding_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                        const float* dout, std::int64_t vocab, std::int64_t channels, float* dwte,
                        float* dwpe);
void embedding_rows_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                            const float* rows_table, std::int64_t row_begin, std::int64_t rows,
                            const float* wpe, const float* in, std::int64_t vocab,
                            std::int64_t channels, float* out);
void embedding_rows_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                             const float* dout, std::int64_t row_begin, std::int64_t rows,
                             std::int64_t vocab, std::int64_t channels, float* drows, float* dwpe);

}  // namespace cpu

// Throw a kUsage Error, on the host, unless every dimension is >= 1.
void embedding_forward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                       std::int64_t seq, const float* wte, const float* wpe, std::int64_t vocab,
                       std::int64_t channels, float* out);
void embedding_backward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                        std::int64_t seq, const float* dout, std::int64_t vocab,
                        std::int64_t channels, float* dwte, float* dwpe);

// Vocabulary pieces (models/gpt_pieces.h): the rows [row_begin, row_begin + rows) of wte as a
// table of their own, `rows_table` [rows, channels]. Forward with wpe: out = row + wpe[t] for a
// token in the range, wpe[t] for any other (the first piece); with wpe null: out = in + row in
// the range, in elsewhere (`in` [batch, seq, channels]; the later pieces). The sum over the
// pieces is embedding_forward's, bit for bit (one nonzero term per element). Backward
// ACCUMULATES dout into drows for the tokens in the range and, when dwpe is given, into dwpe,
// in embedding_backward's order. A token outside [0, vocab) is the same kData Error.
void embedding_rows_forward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                            std::int64_t seq, const float* rows_table, std::int64_t row_begin,
                            std::int64_t rows, const float* wpe, const float* in,
                            std::int64_t vocab, std::int64_t channels, float* out);
void embedding_rows_backward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                             std::int64_t seq, const float* dout, std::int64_t row_begin,
                             std::int64_t rows, std::int64_t vocab, std::int64_t channels,
                             float* drows, float* dwpe);

}  // namespace zest
