#include "data/batch_source.h"

#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace zest {

std::int64_t BatchSlice::rows() const {
  if (accumulation < 1 || world_size < 1 || global_rows < 1 ||
      global_rows % (accumulation * world_size) != 0 || micro_batch < 0 ||
      micro_batch >= accumulation || rank < 0 || rank >= world_size) {
    throw Error(ErrorKind::kUsage,
                "batch slice: a global batch of " + std::to_string(global_rows) +
                    " rows does not split into micro-batch " + std::to_string(micro_batch) +
                    " of " + std::to_string(accumulation) + " on rank " + std::to_string(rank) +
                    " of " + std::to_string(world_size));
  }
  return global_rows / accumulation / world_size;
}

std::int64_t BatchSlice::first_row() const {
  const std::int64_t per_rank = rows();
  return (micro_batch * world_size + rank) * per_rank;
}

namespace {

class ClassificationBatches final : public BatchSource {
 public:
  explicit ClassificationBatches(const SyntheticClassificationOptions& options) : task_(options) {}

  HostBatch training(std::int64_t step, const BatchSlice& slice) const override {
    const std::int64_t first = slice.first_row();
    return task_.rows(step, first, first + slice.rows());
  }
  HostBatch validation(std::int64_t index, const BatchSlice& slice) const override {
    // Note: training draws from steps >= 1; negative steps are samples it never sees.
    const std::int64_t first = slice.first_row();
    return task_.rows(-1 - index, first, first + slice.rows());
  }
  bool has_validation() const override { return true; }
  std::int64_t tokens_per_row() const override { return 1; }

 private:
  SyntheticClassification task_;
};

class SequenceBatches final : public BatchSource {
 public:
  SequenceBatches(TokenBatches training, std::optional<TokenBatches> validation)
      : training_(std::move(training)), validation_(std::move(validation)) {}

  HostBatch training(std::int64_t step, const BatchSlice& slice) const override {
    return cut(training_, step - 1, slice);
  }
  HostBatch validation(std::int64_t index, const BatchSlice& slice) const override {
    if (!validation_) throw Error(ErrorKind::kUsage, "data: no held-out sequences");
    return cut(*validation_, index, slice);
  }
  bool has_validation() const override { return validation_.has_value(); }
  std::int64_t tokens_per_row() const override { return training_.seq_len(); }

 private:
  static HostBatch cut(const TokenBatches& source, std::int64_t batch, const BatchSlice& slice) {
    const std::int64_t rows = slice.rows();
    const std::int64_t seq_len = source.seq_len();
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * seq_len));
    std::vector<std::int32_t> targets(inputs.size());
    source.fill(batch, slice.global_rows, slice.first_row(), rows, inputs.data(), targets.data());
    return HostBatch::tokens(std::move(inputs), std::move(targets), rows, seq_len);
  }

  TokenBatches training_;
  std::optional<TokenBatches> validation_;
};

}  // namespace

std::unique_ptr<BatchSource> classification_batches(const SyntheticClassificationOptions& options) {
  return std::make_unique<ClassificationBatches>(options);
}

std::unique_ptr<BatchSource> sequence_batches(TokenBatches training,
                                              std::optional<TokenBatches> validation) {
  return std::make_unique<SequenceBatches>(std::move(training), std::move(validation));
}

}  // namespace zest
