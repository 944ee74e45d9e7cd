// Batches of next-token prediction sequences cut from a token stream. The stream is cut into
// windows of seq_len + 1 tokens (inputs are the first seq_len, targets the last seq_len), each
// epoch visits the windows in an order drawn from the seed, and epochs wrap. Sequence i of the
// whole run is a pure function of (seed, i): any rank can fill any rows of any global batch on
// its own, so every rank reads exactly its disjoint slice and the global batch does not depend
// on the world size. Validation uses a held-out range of windows, in order.
#pragma once

#include <cstdint>
#include <memory>

#include "data/token_data.h"

namespace zest {

class TokenBatches {
 public:
  // Uses windows [first_window, end_window) of `data`. `shuffle` false visits them in order.
  TokenBatches(std::shared_ptr<const TokenData> data, std::int64_t seq_len, std::uint64_t seed,
               std::int64_t first_window, std::int64_t end_window, bool shuffle);

  // Splits `data` into training and validation windows: the last `val_fraction` of the windows
  // (at least one when val_fraction > 0) are held out. Throws kData when there are not enough
  // tokens for one training window (and one validation window when asked).
  static TokenBatches training(std::shared_ptr<const TokenData> data, std::int64_t seq_len,
                               std::uint64_t seed, double val_fraction);
  static TokenBatches validation(std::shared_ptr<const TokenData> data, std::int64_t seq_len,
                                 double val_fraction);

  std::int64_t windows() const { return end_window_ - first_window_; }
  std::int64_t seq_len() const { return seq_len_; }

  // Fills rows [first_row, first_row + rows) of global batch `batch` (of `global_rows` rows):
  // inputs and targets each [rows, seq_len].
  void fill(std::int64_t batch, std::int64_t global_rows, std::int64_t first_row,
            std::int64_t rows, std::int32_t* inputs, std::int32_t* targets) const;

 private:
  std::int64_t window_of(std::int64_t sequence) const;

  std::shared_ptr<const TokenData> data_;
  std::int64_t seq_len_;
  std::uint64_t seed_;
  std::int64_t first_window_;
  std::int64_t end_window_;
  bool shuffle_;
};

}  // namespace zest
