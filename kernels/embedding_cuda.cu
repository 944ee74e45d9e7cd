#include "kernels/embedding_cuda.h"

#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <string>

#include "base/cuda_check.h"
#include "base/error.h"
#include "kernels/launch_cuda.cuh"

namespace zest::cuda {
namespace {

void check_shape(const char* kernel, std::int64_t batch, std::int64_t seq, std::int64_t vocab,
                 std::int64_t channels) {
  if (batch < 1 || seq < 1 || vocab < 1 || channels < 1 || batch * seq > INT_MAX) {
    throw Error(ErrorKind::kUsage, std::string(kernel) + " (CUDA): needs batch, seq, vocab and " +
                                       "channels >= 1 and batch * seq < 2^31, got " +
                                       std::to_string(batch) + ", " + std::to_string(seq) + ", " +
                                       std::to_string(vocab) + ", " + std::to_string(channels));
  }
}

__global__ void forward_kernel(const std::int32_t* __restrict__ tokens, std::int64_t seq,
                               const float* __restrict__ wte, const float* __restrict__ wpe,
                               std::int64_t vocab, std::int64_t channels, std::size_t count,
                               float* __restrict__ out) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    const std::int64_t position = static_cast<std::int64_t>(i) / channels;
    const std::int64_t c = static_cast<std::int64_t>(i) % channels;
    const std::int32_t token = tokens[position];
    const float* position_row = wpe + (position % seq) * channels;
    out[i] = token >= 0 && token < vocab ? wte[token * channels + c] + position_row[c] : NAN;
  }
}

// A piece of the vocabulary: its rows added to wpe (the first piece) or to the input (the others).
__global__ void rows_forward_kernel(const std::int32_t* __restrict__ tokens, std::int64_t seq,
                                    const float* __restrict__ rows_table, std::int64_t row_begin,
                                    std::int64_t rows, const float* __restrict__ wpe,
                                    const float* __restrict__ in, std::int64_t vocab,
                                    std::int64_t channels, std::size_t count,
                                    float* __restrict__ out) {
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    const std::int64_t position = static_cast<std::int64_t>(i) / channels;
    const std::int64_t c = static_cast<std::int64_t>(i) % channels;
    const std::int32_t token = tokens[position];
    const float base = wpe ? wpe[(position % seq) * channels + c] : in[i];
    const std::int64_t row = static_cast<std::int64_t>(token) - row_begin;
    if (token < 0 || token >= vocab) {
      out[i] = NAN;
    } else {
      out[i] = row >= 0 && row < rows ? rows_table[row * channels + c] + base : base;
    }
  }
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ...: the CPU body's order for each element.
__global__ void position_grad_kernel(const float* __restrict__ dout, std::int64_t batch,
                                     std::int64_t seq, std::int64_t channels,
                                     float* __restrict__ dwpe) {
  const std::size_t count = static_cast<std::size_t>(seq * channels);
  for (std::size_t i = first_index(); i < count; i += grid_stride()) {
    float sum = dwpe[i];
    for (std::int64_t b = 0; b < batch; ++b) sum += dout[static_cast<std::size_t>(b) * count + i];
    dwpe[i] = sum;
  }
}

__global__ void iota_kernel(std::int32_t* positions, std::int32_t count) {
  for (std::size_t i = first_index(); i < static_cast<std::size_t>(count); i += grid_stride()) {
    positions[i] = static_cast<std::int32_t>(i);
  }
}

// One block per sorted slot; the block at the first slot of a token's run adds the run's rows
// to dwte[token] in position order (the sort is stable), as the CPU body does.
__global__ void token_grad_kernel(const std::int32_t* __restrict__ sorted_tokens,
                                  const std::int32_t* __restrict__ sorted_positions,
                                  std::int32_t count, const float* __restrict__ dout,
                                  std::int64_t row_begin, std::int64_t rows,
                                  std::int64_t channels, float* __restrict__ dwte) {
  const std::int32_t first = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t token = sorted_tokens[first];
  if ((first > 0 && sorted_tokens[first - 1] == token) || token < row_begin ||
      token >= row_begin + rows) {
    return;
  }
  float* row = dwte + (token - row_begin) * channels;
  for (std::int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    float sum = row[c];
    for (std::int32_t slot = first; slot < count && sorted_tokens[slot] == token; ++slot) {
      sum += dout[sorted_positions[slot] * channels + c];
    }
    row[c] = sum;
  }
}

// The workspace: sorted tokens, positions, sorted positions, then CUB's storage, each aligned.
struct Layout {
  std::size_t array_bytes;  // one int32 array, rounded up to 256 bytes
  std::size_t cub_bytes;
  std::size_t total() const { return 3 * array_bytes + cub_bytes; }
};

Layout workspace_layout(std::int32_t count) {
  std::size_t cub_bytes = 0;
  ZEST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, cub_bytes, static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), count));
  const std::size_t array_bytes = (static_cast<std::size_t>(count) * 4 + 255) / 256 * 256;
  return {array_bytes, cub_bytes};
}

}  // namespace

void embedding_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                       const float* wte, const float* wpe, std::int64_t vocab,
                       std::int64_t channels, float* out, cudaStream_t stream) {
  check_shape("embedding_forward", batch, seq, vocab, channels);
  const std::size_t count = static_cast<std::size_t>(batch * seq * channels);
  forward_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(tokens, seq, wte, wpe,
                                                                      vocab, channels, count, out);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

std::size_t embedding_backward_workspace_bytes(std::int64_t batch, std::int64_t seq) {
  check_shape("embedding_backward", batch, seq, 1, 1);
  return workspace_layout(static_cast<std::int32_t>(batch * seq)).total();
}

void embedding_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                        const float* dout, std::int64_t vocab, std::int64_t channels,
                        float* dwte, float* dwpe, void* workspace, std::size_t workspace_bytes,
                        cudaStream_t stream) {
  embedding_rows_backward(tokens, batch, seq, dout, 0, vocab, vocab, channels, dwte, dwpe,
                          workspace, workspace_bytes, stream);
}

void embedding_rows_forward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                            const float* rows_table, std::int64_t row_begin, std::int64_t rows,
                            const float* wpe, const float* in, std::int64_t vocab,
                            std::int64_t channels, float* out, cudaStream_t stream) {
  check_shape("embedding_rows_forward", batch, seq, vocab, channels);
  const std::size_t count = static_cast<std::size_t>(batch * seq * channels);
  rows_forward_kernel<<<block_count(count), kThreadsPerBlock, 0, stream>>>(
      tokens, seq, rows_table, row_begin, rows, wpe, in, vocab, channels, count, out);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

void embedding_rows_backward(const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                             const float* dout, std::int64_t row_begin, std::int64_t rows,
                             std::int64_t vocab, std::int64_t channels, float* dwte, float* dwpe,
                             void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  check_shape("embedding_backward", batch, seq, vocab, channels);
  const auto count = static_cast<std::int32_t>(batch * seq);
  const Layout layout = workspace_layout(count);
  if (workspace_bytes < layout.total()) {
    throw Error(ErrorKind::kUsage, "embedding_backward (CUDA): the workspace has " +
                                       std::to_string(workspace_bytes) + " bytes, needs " +
                                       std::to_string(layout.total()));
  }
  if (dwpe) {
    position_grad_kernel<<<block_count(static_cast<std::size_t>(seq * channels)),
                           kThreadsPerBlock, 0, stream>>>(dout, batch, seq, channels, dwpe);
    ZEST_CUDA_CHECK(cudaGetLastError());
  }

  auto* bytes = static_cast<unsigned char*>(workspace);
  auto* sorted_tokens = reinterpret_cast<std::int32_t*>(bytes);
  auto* positions = reinterpret_cast<std::int32_t*>(bytes + layout.array_bytes);
  auto* sorted_positions = reinterpret_cast<std::int32_t*>(bytes + 2 * layout.array_bytes);
  iota_kernel<<<block_count(static_cast<std::size_t>(count)), kThreadsPerBlock, 0, stream>>>(
      positions, count);
  ZEST_CUDA_CHECK(cudaGetLastError());
  // Note: radix sort is stable, so a token's positions stay in increasing order, the order in
  // which the CPU body adds them: the sums are the CPU's, bit for bit, whatever the GPU.
  std::size_t cub_bytes = layout.cub_bytes;
  ZEST_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(bytes + 3 * layout.array_bytes, cub_bytes,
                                                  tokens, sorted_tokens, positions,
                                                  sorted_positions, count, 0,
                                                  static_cast<int>(sizeof(std::int32_t) * 8),
                                                  stream));
  // Note: 256 threads stride over the channels (768 to 1600 in GPT-2); a run of one token is
  // walked by its block alone, so a frequent token costs its count, not atomics.
  token_grad_kernel<<<static_cast<unsigned>(count), kThreadsPerBlock, 0, stream>>>(
      sorted_tokens, sorted_positions, count, dout, row_begin, rows, channels, dwte);
  ZEST_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zest::cuda
