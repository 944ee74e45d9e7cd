#include "data/synthetic_classification.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"

namespace zest {
namespace {

SyntheticClassification make_task(std::uint64_t seed = 7) {
  return SyntheticClassification({/*features=*/16, /*classes=*/5, seed});
}

std::vector<float> inputs_of(const HostBatch& batch) {
  const Tensor& t = batch.batch().inputs;
  return {t.as<float>(), t.as<float>() + t.numel()};
}

std::vector<std::int32_t> targets_of(const HostBatch& batch) {
  const Tensor& t = batch.batch().targets;
  return {t.as<std::int32_t>(), t.as<std::int32_t>() + t.numel()};
}

TEST(SyntheticClassification, BatchHasTheDeclaredShapesAndTypes) {
  const HostBatch batch = make_task().rows(3, 0, 8);
  EXPECT_EQ(batch.batch().inputs.shape, (std::vector<std::int64_t>{8, 16}));
  EXPECT_EQ(batch.batch().inputs.dtype, DType::kFloat32);
  EXPECT_EQ(batch.batch().targets.shape, (std::vector<std::int64_t>{8}));
  EXPECT_EQ(batch.batch().targets.dtype, DType::kInt32);
}

TEST(SyntheticClassification, SameSeedAndStepGiveTheSameBatch) {
  EXPECT_EQ(inputs_of(make_task().rows(5, 0, 32)), inputs_of(make_task().rows(5, 0, 32)));
  EXPECT_EQ(targets_of(make_task().rows(5, 0, 32)), targets_of(make_task().rows(5, 0, 32)));
  EXPECT_NE(inputs_of(make_task().rows(5, 0, 32)), inputs_of(make_task().rows(6, 0, 32)));
  EXPECT_NE(inputs_of(make_task(7).rows(5, 0, 32)), inputs_of(make_task(8).rows(5, 0, 32)));
}

TEST(SyntheticClassification, GlobalBatchIsTheSameWhateverTheWorldSize) {
  const SyntheticClassification task = make_task();
  const std::int64_t global_batch = 48;
  const std::vector<float> reference_inputs = inputs_of(task.rows(11, 0, global_batch));
  const std::vector<std::int32_t> reference_targets = targets_of(task.rows(11, 0, global_batch));
  for (int world_size : {1, 2, 3, 4, 6}) {
    for (std::int64_t accumulation : {1, 2}) {
      std::vector<float> inputs;
      std::vector<std::int32_t> targets;
      for (std::int64_t micro = 0; micro < accumulation; ++micro) {
        for (int rank = 0; rank < world_size; ++rank) {
          const HostBatch slice =
              task.micro_batch(11, micro, accumulation, global_batch, rank, world_size);
          EXPECT_EQ(slice.rows(), global_batch / (accumulation * world_size));
          const auto slice_inputs = inputs_of(slice);
          const auto slice_targets = targets_of(slice);
          inputs.insert(inputs.end(), slice_inputs.begin(), slice_inputs.end());
          targets.insert(targets.end(), slice_targets.begin(), slice_targets.end());
        }
      }
      EXPECT_EQ(inputs, reference_inputs) << world_size << " ranks, " << accumulation;
      EXPECT_EQ(targets, reference_targets) << world_size << " ranks, " << accumulation;
    }
  }
}

TEST(SyntheticClassification, LabelsAreTheTeachersArgmaxAndCoverEveryClass) {
  const SyntheticClassification task = make_task();
  const HostBatch batch = task.rows(1, 0, 2000);
  const auto inputs = inputs_of(batch);
  const auto targets = targets_of(batch);
  std::vector<int> counts(5, 0);
  for (std::size_t i = 0; i < targets.size(); ++i) {
    EXPECT_EQ(targets[i], task.label(inputs.data() + i * 16));
    ASSERT_GE(targets[i], 0);
    ASSERT_LT(targets[i], 5);
    ++counts[static_cast<std::size_t>(targets[i])];
  }
  // A random linear teacher is not exactly balanced; every class must still be common enough
  // to learn: at least a third of its fair share (2000 / 5 / 3 ≈ 133).
  for (int count : counts) EXPECT_GT(count, 133);
}

TEST(SyntheticClassification, InputsLookStandardNormal) {
  const auto inputs = inputs_of(make_task().rows(2, 0, 4096));
  double sum = 0;
  double squares = 0;
  for (float x : inputs) {
    sum += x;
    squares += double{x} * x;
  }
  const double n = static_cast<double>(inputs.size());
  // 65536 samples: the standard error of the mean is 1/256 ≈ 0.004 and of the variance about
  // sqrt(2/n) ≈ 0.0055; 0.03 is more than five of either.
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(squares / n, 1.0, 0.03);
}

TEST(SyntheticClassification, MovedBatchKeepsItsViewsValid) {
  HostBatch first = make_task().rows(4, 0, 8);
  const auto inputs = inputs_of(first);
  const HostBatch moved = std::move(first);
  EXPECT_EQ(inputs_of(moved), inputs);
}

TEST(SyntheticClassification, RejectsSizesThatDoNotSplit) {
  const SyntheticClassification task = make_task();
  EXPECT_THROW(task.micro_batch(1, 0, 1, 10, 0, 4), Error);
  EXPECT_THROW(task.micro_batch(1, 2, 2, 8, 0, 2), Error);
  EXPECT_THROW(task.micro_batch(1, 0, 1, 8, 2, 2), Error);
}

TEST(SyntheticClassification, RejectsDegenerateShapesNamingTheKey) {
  try {
    SyntheticClassification({0, 5, 1});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(error.what()).find("data.features"), std::string::npos);
  }
  try {
    SyntheticClassification({4, 1, 1});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("data.classes"), std::string::npos);
  }
}

}  // namespace
}  // namespace zest
