// Where a rank sits in its tensor-parallel group, and the group's collectives on the residual
// stream that the GPT's units share (models/gpt_block.h, models/tensor_parallel_gpt.h).
//
// Sequence parallelism (Korthikanti et al. 2022): the residual stream's rows — the B·T tokens of
// a [B, T, C] activation — are split in `size` contiguous runs, rank r holding rows
// [r·N/t, (r+1)·N/t) as a [B, T/t, C] tensor. LayerNorm, the residual additions and the biases
// of the row-parallel products are row-wise, so each rank computes them on its rows only; a
// column-parallel product needs every row, so its input is all-gathered first, and a
// row-parallel product's partial sums are reduce-scattered to the rows instead of all-reduced.
// (Megatron splits its [T, B, C] layout along T; for row-wise computations that is the same.)
// Without it every rank holds every row, and the partial sums are all-reduced.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/communicator.h"
#include "runtime/stream.h"

namespace zest {

// Borrowed group: it outlives the model; null at size 1.
struct TensorSlice {
  int rank = 0;
  int size = 1;
  Communicator* group = nullptr;
  bool sequence_parallel = false;  // tensor_parallel.sequence_parallel (size > 1 only)

  // Rows of the residual stream this rank holds, of `rows` in all.
  std::int64_t stream_rows(std::int64_t rows) const {
    return sequence_parallel ? rows / size : rows;
  }
  // The columns-parallel input: `local` [stream_rows(N), columns] made whole [N, columns] in
  // `whole` (all-gathered); without sequence parallelism `local` is whole already and is returned.
  const float* gather_rows(Stream& stream, const float* local, float* whole,
                           std::size_t local_count, const char* label) const;
  // A row-parallel product's partial sums `partial` [N, columns] summed across the group into
  // `out` [stream_rows(N), columns]: reduce-scattered with sequence parallelism, else all-reduced
  // (then `out` must be `partial`). Nothing at size 1.
  void sum_rows(Stream& stream, float* partial, float* out, std::size_t whole_count,
                const char* label) const;
  // Sums `values` across the group in place (nothing at size 1): the gradients of parameters
  // every rank holds whole but computes from its own rows only.
  void sum(Stream& stream, float* values, std::size_t count, const char* label) const;
};

// Throws a kUsage Error naming `unit` unless a sequence of `tokens` splits evenly among the
// group's ranks (sequence parallelism only; the config checks model.seq_len, this the batch
// actually given). The split is of the B·T rows, but a [B, T/t, C] tensor needs t to divide T.
void check_sequence_split(const char* unit, const TensorSlice& slice, std::int64_t tokens);

}  // namespace zest
