#include "models/tensor_slice.h"

#include <string>

#include "base/error.h"

namespace zest {

const float* TensorSlice::gather_rows(Stream& stream, const float* local, float* whole,
                                      std::size_t local_count, const char* label) const {
  if (!sequence_parallel) return local;
  group->label_next(label);
  group->all_gather(stream, local, whole, local_count, DType::kFloat32);
  return whole;
}

void TensorSlice::sum_rows(Stream& stream, float* partial, float* out, std::size_t whole_count,
                           const char* label) const {
  if (size == 1) return;
  group->label_next(label);
  if (sequence_parallel) {
    group->reduce_scatter(stream, partial, out, whole_count / static_cast<std::size_t>(size),
                          DType::kFloat32);
  } else {
    group->all_reduce(stream, partial, out, whole_count, DType::kFloat32);
  }
}

void TensorSlice::sum(Stream& stream, float* values, std::size_t count, const char* label) const {
  if (size == 1) return;
  group->label_next(label);
  group->all_reduce(stream, values, values, count, DType::kFloat32);
}

void check_sequence_split(const char* unit, const TensorSlice& slice, std::int64_t tokens) {
  if (!slice.sequence_parallel || tokens % slice.size == 0) return;
  throw Error(ErrorKind::kUsage,
              std::string(unit) + ": a sequence of " + std::to_string(tokens) +
                  " tokens does not split among tensor_parallel.size " +
                  std::to_string(slice.size) +
                  " ranks under sequence parallelism; give sequences whose length the size "
                  "divides (model.seq_len a multiple of it)");
}

}  // namespace zest
