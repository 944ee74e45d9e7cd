#include "data/synthetic_classification.h"

#include <cmath>
#include <numbers>
#include <string>
#include <utility>

#include "base/error.h"

namespace zest {

namespace {

// splitmix64's finalizer: a bijection on 64 bits whose outputs look independent for adjacent
// inputs, which is what a counter-based generator needs.
std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr std::uint64_t kTeacherSalt = 0x7465616368657221ull;  // "teacher!"
constexpr std::uint64_t kSampleSalt = 0x73616d706c657321ull;   // "samples!"

// Standard normal values from a counter: value k of stream `key` depends on (key, k) only.
// Note: counter-based (not a sequential engine) so that a rank can start at its own rows without
// drawing everyone else's first.
class NormalStream {
 public:
  explicit NormalStream(std::uint64_t key) : key_(key) {}

  void fill(float* out, std::int64_t count) {
    for (std::int64_t i = 0; i < count; i += 2) {
      // Box–Muller on two uniforms in (0, 1]; 53-bit mantissas so log() never sees 0.
      const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const double angle = 2.0 * std::numbers::pi * u2;
      out[i] = static_cast<float>(radius * std::cos(angle));
      if (i + 1 < count) out[i + 1] = static_cast<float>(radius * std::sin(angle));
    }
  }

 private:
  std::uint64_t next() { return mix64(key_ ^ mix64(counter_++)); }

  std::uint64_t key_;
  std::uint64_t counter_ = 0;
};

std::uint64_t sample_key(std::uint64_t seed, std::int64_t step, std::int64_t row) {
  std::uint64_t key = mix64(seed ^ kSampleSalt);
  key = mix64(key ^ static_cast<std::uint64_t>(step));
  return mix64(key ^ static_cast<std::uint64_t>(row));
}

}  // namespace

SyntheticClassification::SyntheticClassification(SyntheticClassificationOptions options)
    : options_(options) {
  if (options_.features < 1) {
    throw Error(ErrorKind::kConfig,
                "data.features: must be >= 1, got " + std::to_string(options_.features));
  }
  if (options_.classes < 2) {
    throw Error(ErrorKind::kConfig,
                "data.classes: must be >= 2, got " + std::to_string(options_.classes));
  }
  teacher_.resize(static_cast<std::size_t>(options_.classes * options_.features));
  NormalStream(mix64(options_.seed ^ kTeacherSalt))
      .fill(teacher_.data(), static_cast<std::int64_t>(teacher_.size()));
}

std::int32_t SyntheticClassification::label(const float* input) const {
  std::int32_t best = 0;
  double best_score = 0.0;
  for (std::int64_t c = 0; c < options_.classes; ++c) {
    const float* weights = teacher_.data() + c * options_.features;
    double score = 0.0;
    for (std::int64_t f = 0; f < options_.features; ++f) score += double{weights[f]} * input[f];
    if (c == 0 || score > best_score) {
      best = static_cast<std::int32_t>(c);
      best_score = score;
    }
  }
  return best;
}

HostBatch SyntheticClassification::rows(std::int64_t step, std::int64_t begin,
                                        std::int64_t end) const {
  if (begin < 0 || end < begin) {
    throw Error(ErrorKind::kUsage, "synthetic data: bad row range [" + std::to_string(begin) +
                                       ", " + std::to_string(end) + ")");
  }
  const std::int64_t count = end - begin;
  const std::int64_t features = options_.features;
  std::vector<float> inputs(static_cast<std::size_t>(count * features));
  std::vector<std::int32_t> targets(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    float* input = inputs.data() + i * features;
    NormalStream(sample_key(options_.seed, step, begin + i)).fill(input, features);
    targets[static_cast<std::size_t>(i)] = label(input);
  }
  return HostBatch::features(std::move(inputs), std::move(targets), features);
}

HostBatch SyntheticClassification::micro_batch(std::int64_t step, std::int64_t micro_batch,
                                               std::int64_t accumulation,
                                               std::int64_t global_batch, int rank,
                                               int world_size) const {
  if (accumulation < 1 || world_size < 1 || global_batch % (accumulation * world_size) != 0 ||
      micro_batch < 0 || micro_batch >= accumulation || rank < 0 || rank >= world_size) {
    throw Error(ErrorKind::kUsage,
                "synthetic data: global batch " + std::to_string(global_batch) +
                    " does not split into micro-batch " + std::to_string(micro_batch) + " of " +
                    std::to_string(accumulation) + " on rank " + std::to_string(rank) + " of " +
                    std::to_string(world_size));
  }
  const std::int64_t per_micro_batch = global_batch / accumulation;
  const std::int64_t per_rank = per_micro_batch / world_size;
  const std::int64_t begin = micro_batch * per_micro_batch + rank * per_rank;
  return rows(step, begin, begin + per_rank);
}

}  // namespace zest
