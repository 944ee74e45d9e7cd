#include "kernels/embedding.h"

#include <string>

#include "base/error.h"
#include "kernels/dispatch.h"

#if ZEST_HAVE_CUDA
#include "kernels/embedding_cuda.h"
#include "runtime/cuda_stream.h"
#endif

namespace zest {
namespace {

void check_shape(const char* kernel, std::int64_t batch, std::int64_t seq, std::int64_t vocab,
                 std::int64_t channels) {
  if (batch < 1 || seq < 1 || vocab < 1 || channels < 1) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": needs batch, seq, vocab and channels" +
                                       " >= 1, got " + std::to_string(batch) + ", " +
                                       std::to_string(seq) + ", " + std::to_string(vocab) + ", " +
                                       std::to_string(channels));
  }
}

void check_tokens(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                  std::int64_t vocab) {
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int32_t token = tokens[b * seq + t];
      if (token < 0 || token >= vocab) {
        throw Error(ErrorKind::kData, "embedding: token at position [" + std::to_string(b) +
                                          ", " + std::to_string(t) + "] is " +
                                          std::to_string(token) + ", outside the vocabulary [0, " +
                                          std::to_string(vocab) + ")");
      }
    }
  }
}

}  // namespace

namespace cpu {

void embedding_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                       const float* wte, const float* wpe, std::int64_t vocab,
                       std::int64_t channels, float* out) {
  check_tokens(tokens, batch, seq, vocab);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const float* __restrict token_row = wte + tokens[b * seq + t] * channels;
      const float* __restrict position_row = wpe + t * channels;
      float* __restrict row = out + (b * seq + t) * channels;
      for (std::int64_t c = 0; c < channels; ++c) row[c] = token_row[c] + position_row[c];
    }
  }
}

void embedding_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                        const float* dout, std::int64_t vocab, std::int64_t channels, float* dwte,
                        float* dwpe) {
  check_tokens(tokens, batch, seq, vocab);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const float* __restrict row = dout + (b * seq + t) * channels;
      float* __restrict token_row = dwte + tokens[b * seq + t] * channels;
      float* __restrict position_row = dwpe + t * channels;
      for (std::int64_t c = 0; c < channels; ++c) {
        token_row[c] += row[c];
        position_row[c] += row[c];
      }
    }
  }
}

void embedding_rows_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                            const float* rows_table, std::int64_t row_begin, std::int64_t rows,
                            const float* wpe, const float* in, std::int64_t vocab,
                            std::int64_t channels, float* out) {
  check_tokens(tokens, batch, seq, vocab);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const std::int64_t n = b * seq + t;
      const std::int64_t token = tokens[n] - row_begin;
      const float* __restrict base = wpe ? wpe + t * channels : in + n * channels;
      float* __restrict row = out + n * channels;
      if (token < 0 || token >= rows) {
        for (std::int64_t c = 0; c < channels; ++c) row[c] = base[c];
        continue;
      }
      const float* __restrict token_row = rows_table + token * channels;
      for (std::int64_t c = 0; c < channels; ++c) row[c] = token_row[c] + base[c];
    }
  }
}

void embedding_rows_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                             const float* dout, std::int64_t row_begin, std::int64_t rows,
                             std::int64_t vocab, std::int64_t channels, float* drows,
                             float* dwpe) {
  check_tokens(tokens, batch, seq, vocab);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq; ++t) {
      const float* __restrict row = dout + (b * seq + t) * channels;
      const std::int64_t token = tokens[b * seq + t] - row_begin;
      if (token >= 0 && token < rows) {
        float* __restrict token_row = drows + token * channels;
        for (std::int64_t c = 0; c < channels; ++c) token_row[c] += row[c];
      }
      if (!dwpe) continue;
      float* __restrict position_row = dwpe + t * channels;
      for (std::int64_t c = 0; c < channels; ++c) position_row[c] += row[c];
    }
  }
}

}  // namespace cpu

void embedding_forward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                       std::int64_t seq, const float* wte, const float* wpe, std::int64_t vocab,
                       std::int64_t channels, float* out) {
  check_shape("embedding_forward", batch, seq, vocab, channels);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::embedding_forward(tokens, batch, seq, wte, wpe, vocab, channels, out,
                            cuda::stream_handle(stream, "embedding_forward"));
    return;
  }
#endif
  dispatch_kernel(stream, "embedding_forward", [=] {
    cpu::embedding_forward(tokens, batch, seq, wte, wpe, vocab, channels, out);
  });
}

void embedding_backward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                        std::int64_t seq, const float* dout, std::int64_t vocab,
                        std::int64_t channels, float* dwte, float* dwpe) {
  check_shape("embedding_backward", batch, seq, vocab, channels);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    // The stream first: the workspace size asks the device, which a stream that is not a
    // CudaStream may not have.
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "embedding_backward");
    const std::size_t bytes = cuda::embedding_backward_workspace_bytes(batch, seq);
    cuda::embedding_backward(tokens, batch, seq, dout, vocab, channels, dwte, dwpe,
                             cuda.workspace(bytes, "embedding_backward"), bytes, cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "embedding_backward", [=] {
    cpu::embedding_backward(tokens, batch, seq, dout, vocab, channels, dwte, dwpe);
  });
}

namespace {

void check_rows(const char* kernel, std::int64_t row_begin, std::int64_t rows, std::int64_t vocab,
                bool has_base) {
  if (row_begin < 0 || rows < 1 || row_begin + rows > vocab || !has_base) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + ": needs rows [" +
                                       std::to_string(row_begin) + ", " +
                                       std::to_string(row_begin + rows) + ") inside [0, " +
                                       std::to_string(vocab) + ") and wpe or in");
  }
}

}  // namespace

void embedding_rows_forward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                            std::int64_t seq, const float* rows_table, std::int64_t row_begin,
                            std::int64_t rows, const float* wpe, const float* in,
                            std::int64_t vocab, std::int64_t channels, float* out) {
  check_shape("embedding_rows_forward", batch, seq, vocab, channels);
  check_rows("embedding_rows_forward", row_begin, rows, vocab, wpe || in);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::embedding_rows_forward(tokens, batch, seq, rows_table, row_begin, rows, wpe, in, vocab,
                                 channels, out, cuda::stream_handle(stream, "embedding_forward"));
    return;
  }
#endif
  dispatch_kernel(stream, "embedding_forward", [=] {
    cpu::embedding_rows_forward(tokens, batch, seq, rows_table, row_begin, rows, wpe, in, vocab,
                                channels, out);
  });
}

void embedding_rows_backward(Stream& stream, const std::int32_t* tokens, std::int64_t batch,
                             std::int64_t seq, const float* dout, std::int64_t row_begin,
                             std::int64_t rows, std::int64_t vocab, std::int64_t channels,
                             float* drows, float* dwpe) {
  check_shape("embedding_rows_backward", batch, seq, vocab, channels);
  check_rows("embedding_rows_backward", row_begin, rows, vocab, true);
#if ZEST_HAVE_CUDA
  if (on_cuda(stream)) {
    cuda::CudaStream& cuda = cuda::cuda_stream(stream, "embedding_backward");
    const std::size_t bytes = cuda::embedding_backward_workspace_bytes(batch, seq);
    cuda::embedding_rows_backward(tokens, batch, seq, dout, row_begin, rows, vocab, channels,
                                  drows, dwpe, cuda.workspace(bytes, "embedding_backward"), bytes,
                                  cuda.handle());
    return;
  }
#endif
  dispatch_kernel(stream, "embedding_backward", [=] {
    cpu::embedding_rows_backward(tokens, batch, seq, dout, row_begin, rows, vocab, channels, drows,
                                 dwpe);
  });
}

}  // namespace zest
