#include "data/token_batches.h"

#include <numeric>

#include "base/error.h"

namespace zest {

namespace {

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::int64_t total_windows(const TokenData& data, std::int64_t seq_len) {
  const auto tokens = static_cast<std::int64_t>(data.tokens.size());
  return tokens > seq_len ? (tokens - 1) / seq_len : 0;
}

// Note: data of no whole window holds none out either, so that its message counts 0 windows,
// not -1.
std::int64_t held_out(std::int64_t windows, double val_fraction) {
  if (val_fraction <= 0.0 || windows <= 0) return 0;
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(windows * val_fraction));
}

void require_windows(std::int64_t have, std::int64_t need, std::int64_t seq_len, const char* what) {
  if (have < need) {
    throw Error(ErrorKind::kData, std::string("data: not enough tokens for ") + what + " (" +
                                      std::to_string(have) + " windows of model.seq_len + 1 = " +
                                      std::to_string(seq_len + 1) +
                                      " tokens); give more data or a smaller seq_len or val_fraction");
  }
}

}  // namespace

TokenBatches::TokenBatches(std::shared_ptr<const TokenData> data, std::int64_t seq_len,
                           std::uint64_t seed, std::int64_t first_window, std::int64_t end_window,
                           bool shuffle)
    : data_(std::move(data)), seq_len_(seq_len), seed_(seed), first_window_(first_window),
      end_window_(end_window), shuffle_(shuffle) {
  require_windows(end_window - first_window, 1, seq_len, "one sequence");
}

TokenBatches TokenBatches::training(std::shared_ptr<const TokenData> data, std::int64_t seq_len,
                                   std::uint64_t seed, double val_fraction) {
  const std::int64_t windows = total_windows(*data, seq_len);
  const std::int64_t validation = held_out(windows, val_fraction);
  require_windows(windows - validation, 1, seq_len, "training after the validation split");
  return TokenBatches(std::move(data), seq_len, seed, 0, windows - validation, true);
}

TokenBatches TokenBatches::validation(std::shared_ptr<const TokenData> data, std::int64_t seq_len,
                                      double val_fraction) {
  const std::int64_t windows = total_windows(*data, seq_len);
  const std::int64_t validation = held_out(windows, val_fraction);
  require_windows(validation, 1, seq_len, "validation");
  return TokenBatches(std::move(data), seq_len, 0, windows - validation, windows, false);
}

std::int64_t TokenBatches::window_of(std::int64_t sequence) const {
  const std::int64_t count = windows();
  const std::int64_t epoch = sequence / count;
  const std::int64_t position = sequence % count;
  if (!shuffle_ || count == 1) return first_window_ + position;
  // An affine permutation of [0, count) per epoch: multiplier coprime to count, so every
  // window is visited exactly once per epoch; stateless, so ranks need not share anything.
  const std::uint64_t draw = mix(seed_ ^ mix(static_cast<std::uint64_t>(epoch)));
  std::uint64_t multiplier = 1 + draw % static_cast<std::uint64_t>(count);
  while (std::gcd(multiplier, static_cast<std::uint64_t>(count)) != 1) ++multiplier;
  const std::uint64_t offset = mix(draw) % static_cast<std::uint64_t>(count);
  const auto permuted = static_cast<std::int64_t>(
      (static_cast<unsigned __int128>(multiplier) * position + offset) % count);
  return first_window_ + permuted;
}

void TokenBatches::fill(std::int64_t batch, std::int64_t global_rows, std::int64_t first_row,
                        std::int64_t rows, std::int32_t* inputs, std::int32_t* targets) const {
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t sequence = batch * global_rows + first_row + row;
    const std::uint16_t* window = data_->tokens.data() + window_of(sequence) * seq_len_;
    for (std::int64_t t = 0; t < seq_len_; ++t) {
      inputs[row * seq_len_ + t] = window[t];
      targets[row * seq_len_ + t] = window[t + 1];
    }
  }
}

}  // namespace zest
