// The vocabulary-parallel cross-entropy (kernels/vocab_parallel_cross_entropy.h) as a group of t
// ranks runs it, the group's all-gather and all-reduce done here by hand, against a float64
// softmax over the whole rows: the loss and every row's log-sum-exp within 1e-6 relative, each
// rank's d(logits) within 1e-6 of the row's scale, at t = 1, 2 and 4 (t = 1 is the plain
// cross-entropy); every rank ends with the same loss; a target outside the vocabulary is one
// kData error naming its row, raised on the stream; a
// stream that says CUDA but is not one is refused by each kernel.
#include "kernels/vocab_parallel_cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "tests/kernels/cuda_refusal.h"

namespace zest {
namespace {

constexpr std::int64_t kRows = 29;
constexpr std::int64_t kClasses = 1000;

struct Problem {
  std::vector<float> logits;  // [kRows, kClasses]
  std::vector<std::int32_t> targets;

  Problem() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    logits.resize(static_cast<std::size_t>(kRows * kClasses));
    for (float& x : logits) x = normal(rng);
    for (std::int64_t r = 0; r < kRows; ++r) {
      targets.push_back(static_cast<std::int32_t>(r * 389 % kClasses));
    }
  }

  // Rank `rank` of `group`'s columns, [kRows, kClasses / group].
  std::vector<float> columns(int rank, int group) const {
    const std::int64_t cols = kClasses / group;
    std::vector<float> out;
    for (std::int64_t r = 0; r < kRows; ++r) {
      const float* row = logits.data() + r * kClasses + rank * cols;
      out.insert(out.end(), row, row + cols);
    }
    return out;
  }
};

struct RankResult {
  float loss = 0;
  std::vector<float> lse, dlogits;
};

// Every rank's steps in the group's order: row maxima, all-gathered; partials, all-reduced in
// float (as the collective adds them); finish; backward in place.
std::vector<RankResult> run_group(const Problem& p, int group, float scale) {
  const std::int64_t cols = kClasses / group;
  std::vector<std::vector<float>> logits(group);
  std::vector<float> gathered(static_cast<std::size_t>(group * kRows));
  for (int rank = 0; rank < group; ++rank) {
    logits[rank] = p.columns(rank, group);
    cpu::vocab_parallel_row_max(logits[rank].data(), kRows, cols, gathered.data() + rank * kRows);
  }
  std::vector<std::vector<float>> partials(group, std::vector<float>(2 * kRows));
  std::vector<float> max(kRows);
  for (int rank = 0; rank < group; ++rank) {
    cpu::vocab_parallel_partials(logits[rank].data(), p.targets.data(), kRows, cols, rank * cols,
                                 kClasses, gathered.data(), group, max.data(),
                                 partials[rank].data());
  }
  std::vector<float> summed(2 * kRows, 0.0f);
  for (int rank = 0; rank < group; ++rank) {
    for (std::size_t i = 0; i < summed.size(); ++i) summed[i] += partials[rank][i];
  }
  std::vector<RankResult> results(group);
  for (int rank = 0; rank < group; ++rank) {
    RankResult& result = results[rank];
    result.lse.resize(kRows);
    cpu::vocab_parallel_finish(max.data(), summed.data(), kRows, result.lse.data(), &result.loss);
    result.dlogits = logits[rank];
    cpu::vocab_parallel_cross_entropy_backward(result.dlogits.data(), p.targets.data(), kRows, cols,
                                               rank * cols, result.lse.data(), scale,
                                               result.dlogits.data());
  }
  return results;
}

class VocabParallelCrossEntropy : public ::testing::TestWithParam<int> {};

TEST_P(VocabParallelCrossEntropy, MatchesAFloat64SoftmaxOverTheWholeRows) {
  const int group = GetParam();
  const Problem p;
  const float scale = 512.0f;
  const std::vector<RankResult> results = run_group(p, group, scale);

  double loss = 0.0;
  std::vector<double> lse(kRows);
  for (std::int64_t r = 0; r < kRows; ++r) {
    const float* row = p.logits.data() + r * kClasses;
    const double max = *std::max_element(row, row + kClasses);
    double sum = 0.0;
    for (std::int64_t c = 0; c < kClasses; ++c) sum += std::exp(row[c] - max);
    lse[r] = max + std::log(sum);
    loss += lse[r] - row[p.targets[r]];
  }
  loss /= kRows;

  const std::int64_t cols = kClasses / group;
  const double row_scale = scale / static_cast<double>(kRows);
  for (int rank = 0; rank < group; ++rank) {
    const RankResult& got = results[rank];
    EXPECT_EQ(got.loss, results[0].loss) << "rank " << rank;
    EXPECT_NEAR(got.loss, loss, 1e-6 * loss) << "rank " << rank;
    for (std::int64_t r = 0; r < kRows; ++r) {
      ASSERT_NEAR(got.lse[r], lse[r], 1e-6 * std::fabs(lse[r])) << "rank " << rank << " row " << r;
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t whole = rank * cols + c;
        const double want =
            (std::exp(p.logits[r * kClasses + whole] - lse[r]) - (whole == p.targets[r])) *
            row_scale;
        ASSERT_NEAR(got.dlogits[r * cols + c], want, 1e-6 * row_scale)
            << "rank " << rank << " row " << r << " column " << c;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, VocabParallelCrossEntropy, ::testing::Values(1, 2, 4));

TEST(VocabParallelCrossEntropyErrors, ATargetOutsideTheVocabularyIsADataErrorNamingItsRow) {
  const Problem p;
  std::vector<std::int32_t> targets = p.targets;
  targets[5] = static_cast<std::int32_t>(kClasses);
  const std::vector<float> columns = p.columns(1, 2);
  const std::int64_t cols = kClasses / 2;
  std::vector<float> gathered(2 * kRows, 0.0f), max(kRows), partial(2 * kRows);
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  vocab_parallel_partials(*stream, columns.data(), targets.data(), kRows, cols, cols, kClasses,
                          gathered.data(), 2, max.data(), partial.data());
  try {
    stream->synchronize();
    FAIL() << "expected a kData error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    EXPECT_STREQ(error.what(),
                 "stream 'compute': cross-entropy: target 1000 at row 5 is outside [0, 1000)");
  }
}

TEST(VocabParallelCrossEntropyErrors, AnEmptyShapeIsRefusedAtTheCall) {
  cpu::CpuDevice device(0);
  auto stream = device.create_stream("compute");
  float max = 0;
  try {
    vocab_parallel_row_max(*stream, &max, 0, 4, &max);
    FAIL() << "expected a kUsage error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_STREQ(error.what(), "vocab_parallel_row_max: rows and cols must be >= 1, got 0 x 4");
  }
}

// A stream that says CUDA but is not a CudaStream: each kernel refuses it on the host.
TEST(VocabParallelCrossEntropyErrors, AStreamThatIsNotACudaStreamIsRefusedByEachKernel) {
  float v = 0.0f;
  const std::int32_t target = 0;
  testing::expect_cuda_stream_refused("vocab_parallel_row_max", [&](Stream& stream) {
    vocab_parallel_row_max(stream, &v, 1, 1, &v);
  });
  testing::expect_cuda_stream_refused("vocab_parallel_partials", [&](Stream& stream) {
    vocab_parallel_partials(stream, &v, &target, 1, 1, 0, 1, &v, 1, &v, &v);
  });
  testing::expect_cuda_stream_refused("vocab_parallel_finish", [&](Stream& stream) {
    vocab_parallel_finish(stream, &v, &v, 1, &v, &v);
  });
  testing::expect_cuda_stream_refused("vocab_parallel_cross_entropy_backward", [&](Stream& stream) {
    vocab_parallel_cross_entropy_backward(stream, &v, &target, 1, 1, 0, &v, 1.0f, &v);
  });
}

}  // namespace
}  // namespace zest
