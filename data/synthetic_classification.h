// A learnable classification task made from a seed, for tests and the default trainer job. A
// fixed random "teacher" (a linear map from features to classes) labels inputs drawn from
// N(0, 1) by the argmax of its scores, so an MLP can fit it and its loss clearly falls.
// Invariant: every sample is a pure function of (seed, step, row) — a step's global batch is the
// same whatever the world size, and a rank generates only its own rows.
#pragma once

#include <cstdint>
#include <vector>

#include "data/host_batch.h"

namespace zest {

struct SyntheticClassificationOptions {
  std::int64_t features = 0;  // input width (the model's first size)
  std::int64_t classes = 0;   // number of labels (the model's last size)
  std::uint64_t seed = 0;     // picks the teacher and every sample
};

class SyntheticClassification {
 public:
  // Throws a kConfig Error naming data.features / data.classes when either is < 1 (or classes
  // < 2).
  explicit SyntheticClassification(SyntheticClassificationOptions options);

  const SyntheticClassificationOptions& options() const { return options_; }

  // Rows [begin, end) of step `step`'s global batch.
  HostBatch rows(std::int64_t step, std::int64_t begin, std::int64_t end) const;

  // This rank's rows of one micro-batch. A global batch of `global_batch` rows is cut into
  // `accumulation` consecutive micro-batches of global_batch / accumulation rows; rank r of N
  // takes the r-th of N equal consecutive runs of micro-batch m. Throws kUsage when the sizes
  // do not divide.
  HostBatch micro_batch(std::int64_t step, std::int64_t micro_batch, std::int64_t accumulation,
                        std::int64_t global_batch, int rank, int world_size) const;

  // The teacher's label for one input of `features` values.
  std::int32_t label(const float* input) const;

 private:
  SyntheticClassificationOptions options_;
  std::vector<float> teacher_;  // [classes, features], row-major
};

}  // namespace zest
