// Where a training run's batches come from, whatever the task: the synthetic classification
// task (an MLP's float features) or next-token sequences cut from token files or text (a GPT).
// Every batch is a pure function of the source's seed and the step, and every rank builds only
// its own rows, so a step's global batch is the same whatever the world size, and a resumed
// run continues from the step alone (the data-loader position is the step).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "data/host_batch.h"
#include "data/synthetic_classification.h"
#include "data/token_batches.h"

namespace zest {

// One rank's part of one micro-batch: the global batch of `global_rows` rows is cut into
// `accumulation` consecutive micro-batches, and rank r of N takes the r-th of N equal
// consecutive runs of rows of each (DeepSpeed's data-parallel layout).
struct BatchSlice {
  std::int64_t global_rows = 0;  // train_batch_size
  std::int64_t accumulation = 1;
  std::int64_t micro_batch = 0;  // which one, 0 .. accumulation-1
  int rank = 0;
  int world_size = 1;

  // Throws kUsage when the sizes do not divide or an index is out of range.
  std::int64_t rows() const;
  std::int64_t first_row() const;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // This rank's rows of step `step`'s global batch (steps count from 1).
  virtual HostBatch training(std::int64_t step, const BatchSlice& slice) const = 0;
  // This rank's rows of held-out batch `index` (0, 1, ...: the same rows every evaluation).
  // Throws kUsage when the source holds no held-out data.
  virtual HostBatch validation(std::int64_t index, const BatchSlice& slice) const = 0;
  virtual bool has_validation() const = 0;
  // Tokens one row carries, for throughput: seq_len for sequences, 1 for a classification
  // sample (which is then counted as one token).
  virtual std::int64_t tokens_per_row() const = 0;
};

// The synthetic classification task; held-out batches are drawn from steps no training batch
// uses.
std::unique_ptr<BatchSource> classification_batches(const SyntheticClassificationOptions& options);

// Sequences from `training`; held-out ones from `validation` when given.
std::unique_ptr<BatchSource> sequence_batches(TokenBatches training,
                                              std::optional<TokenBatches> validation);

}  // namespace zest
