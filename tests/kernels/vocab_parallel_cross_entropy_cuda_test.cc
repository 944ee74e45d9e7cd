// ctest-labels: gpu
// The CUDA vocabulary-parallel cross-entropy against its CPU body, each rank of a group of 4 on
// the same columns: the row maxima exactly, the exp-sums (double sums in another order) and the
// log-sum-exp and mean loss within 1e-6 relative, each rank's d(logits) in place within 1e-6 of
// the row's scale; a target outside the vocabulary makes the loss NaN (a kernel cannot throw).
// Written without a GPU in its session: compiled and run where one exists.
#include "kernels/vocab_parallel_cross_entropy_cuda.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/vocab_parallel_cross_entropy.h"
#include "tests/support/cuda_test_support.h"

namespace zest {
namespace {

using testing::DeviceArray;

constexpr std::int64_t kRows = 37;
constexpr int kGroup = 4;
constexpr std::int64_t kCols = 251;  // a rank's columns: not a multiple of the block's threads
constexpr std::int64_t kClasses = kGroup * kCols;

std::vector<std::int32_t> targets_of(std::int64_t outside_row = -1) {
  std::vector<std::int32_t> targets(kRows);
  for (std::int64_t r = 0; r < kRows; ++r) {
    targets[r] = static_cast<std::int32_t>(r * 389 % kClasses);
  }
  if (outside_row >= 0) targets[outside_row] = static_cast<std::int32_t>(kClasses);
  return targets;
}

// Each rank's [kRows, kCols] columns.
std::vector<std::vector<float>> rank_logits() {
  std::vector<std::vector<float>> logits;
  for (int rank = 0; rank < kGroup; ++rank) {
    logits.push_back(testing::random_floats(kRows * kCols, 10 + rank, 4.0f, 0.0f));
  }
  return logits;
}

struct GroupRun {
  std::vector<float> gathered, max, summed, lse, loss;
  std::vector<std::vector<float>> dlogits;
};

// The group's steps on the device, the all-gather and the all-reduce (in float) on the host.
GroupRun run_on_cuda(const std::vector<std::vector<float>>& logits,
                     const std::vector<std::int32_t>& targets, float scale) {
  GroupRun run;
  DeviceArray<std::int32_t> d_targets(targets);
  std::vector<std::unique_ptr<DeviceArray<float>>> d_logits;
  for (const auto& columns : logits)
    d_logits.push_back(std::make_unique<DeviceArray<float>>(columns));
  DeviceArray<float> d_max(kRows);
  for (int rank = 0; rank < kGroup; ++rank) {
    cuda::vocab_parallel_row_max(d_logits[rank]->data(), kRows, kCols, d_max.data(), nullptr);
    const std::vector<float> max = d_max.download();
    run.gathered.insert(run.gathered.end(), max.begin(), max.end());
  }
  DeviceArray<float> d_gathered(run.gathered), d_partial(2 * kRows);
  run.summed.assign(2 * kRows, 0.0f);
  for (int rank = 0; rank < kGroup; ++rank) {
    cuda::vocab_parallel_partials(d_logits[rank]->data(), d_targets.data(), kRows, kCols,
                                  rank * kCols, kClasses, d_gathered.data(), kGroup, d_max.data(),
                                  d_partial.data(), nullptr);
    const std::vector<float> partial = d_partial.download();
    for (std::size_t i = 0; i < partial.size(); ++i) run.summed[i] += partial[i];
  }
  run.max = d_max.download();
  DeviceArray<float> d_summed(run.summed), d_lse(kRows), d_loss(1);
  cuda::vocab_parallel_finish(d_max.data(), d_summed.data(), kRows, d_lse.data(), d_loss.data(),
                              nullptr);
  run.lse = d_lse.download();
  run.loss = d_loss.download();
  for (int rank = 0; rank < kGroup; ++rank) {
    cuda::vocab_parallel_cross_entropy_backward(d_logits[rank]->data(), d_targets.data(), kRows,
                                                kCols, rank * kCols, d_lse.data(), scale,
                                                d_logits[rank]->data(), nullptr);
    run.dlogits.push_back(d_logits[rank]->download());
  }
  return run;
}

TEST(VocabParallelCrossEntropyCuda, EveryStepMatchesTheCpuBody) {
  ZEST_SKIP_WITHOUT_CUDA();
  const auto logits = rank_logits();
  const auto targets = targets_of();
  const float scale = 1024.0f;
  const GroupRun got = run_on_cuda(logits, targets, scale);

  std::vector<float> gathered(kGroup * kRows);
  for (int rank = 0; rank < kGroup; ++rank) {
    cpu::vocab_parallel_row_max(logits[rank].data(), kRows, kCols, gathered.data() + rank * kRows);
  }
  EXPECT_EQ(got.gathered, gathered);
  std::vector<float> max(kRows), partial(2 * kRows), summed(2 * kRows, 0.0f);
  for (int rank = 0; rank < kGroup; ++rank) {
    cpu::vocab_parallel_partials(logits[rank].data(), targets.data(), kRows, kCols, rank * kCols,
                                 kClasses, gathered.data(), kGroup, max.data(), partial.data());
    for (std::size_t i = 0; i < partial.size(); ++i) summed[i] += partial[i];
  }
  EXPECT_EQ(got.max, max);
  for (std::size_t i = 0; i < summed.size(); ++i) {
    ASSERT_NEAR(got.summed[i], summed[i], 1e-6 * std::fabs(summed[i])) << i;
  }
  std::vector<float> lse(kRows);
  float loss = 0.0f;
  cpu::vocab_parallel_finish(max.data(), summed.data(), kRows, lse.data(), &loss);
  EXPECT_NEAR(got.loss[0], loss, 1e-6 * std::fabs(loss));
  for (std::int64_t r = 0; r < kRows; ++r) {
    EXPECT_NEAR(got.lse[r], lse[r], 1e-6 * std::fabs(lse[r])) << r;
  }
  const float row_scale = scale / static_cast<float>(kRows);
  for (int rank = 0; rank < kGroup; ++rank) {
    // The device's own lse, so that only the backward kernel differs.
    std::vector<float> want = logits[rank];
    cpu::vocab_parallel_cross_entropy_backward(want.data(), targets.data(), kRows, kCols,
                                               rank * kCols, got.lse.data(), scale, want.data());
    for (std::size_t e = 0; e < want.size(); ++e) {
      ASSERT_NEAR(got.dlogits[rank][e], want[e], 1e-6 * std::fabs(want[e]) + 1e-6 * row_scale)
          << "rank " << rank << " element " << e;
    }
  }
}

TEST(VocabParallelCrossEntropyCuda, ATargetOutsideTheVocabularyMakesTheLossNaN) {
  ZEST_SKIP_WITHOUT_CUDA();
  const GroupRun got = run_on_cuda(rank_logits(), targets_of(5), 1.0f);
  EXPECT_TRUE(std::isnan(got.summed[kRows + 5]));
  EXPECT_TRUE(std::isnan(got.loss[0]));
  EXPECT_FALSE(std::isnan(got.summed[kRows + 4]));
}

}  // namespace
}  // namespace zest
