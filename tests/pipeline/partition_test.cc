#include "pipeline/partition.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"

namespace zest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string config_error(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig) << error.what();
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "expected a kConfig Error";
  return "";
}

// Every contiguous split of `units` into `pipeline_stages` non-empty runs: the reference the
// balanced search is held against.
void every_split(std::size_t units, int pipeline_stages, std::vector<std::size_t>& prefix,
                 const std::function<void(const std::vector<std::size_t>&)>& visit) {
  const std::size_t used = std::accumulate(prefix.begin(), prefix.end(), std::size_t{0});
  if (static_cast<int>(prefix.size()) == pipeline_stages - 1) {
    if (units > used) {
      prefix.push_back(units - used);
      visit(prefix);
      prefix.pop_back();
    }
    return;
  }
  for (std::size_t count = 1; used + count + (pipeline_stages - 1 - prefix.size()) <= units;
       ++count) {
    prefix.push_back(count);
    every_split(units, pipeline_stages, prefix, visit);
    prefix.pop_back();
  }
}

std::uint64_t largest_stage(const std::vector<std::size_t>& split, const UnitCost& cost) {
  std::uint64_t largest = 0;
  std::size_t unit = 0;
  for (std::size_t v = 0; v < split.size(); ++v) {
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < split[v]; ++i) sum += cost(static_cast<int>(v), unit++);
    largest = std::max(largest, sum);
  }
  return largest;
}

TEST(Partition, UniformPutsTheRemainderOnTheFirstStages) {
  EXPECT_THAT(uniform_partition(8, 4), ElementsAre(2, 2, 2, 2));
  EXPECT_THAT(uniform_partition(7, 3), ElementsAre(3, 2, 2));
  EXPECT_THAT(uniform_partition(10, 4), ElementsAre(3, 3, 2, 2));
  EXPECT_THAT(uniform_partition(3, 3), ElementsAre(1, 1, 1));
  EXPECT_THAT(uniform_partition(5, 1), ElementsAre(5));
}

TEST(Partition, FewerUnitsThanVirtualStagesIsOneLineNamingTheKey) {
  const std::string message = config_error([] { uniform_partition(3, 4); });
  EXPECT_THAT(message, StartsWith("pipeline.partition: "));
  EXPECT_THAT(message, HasSubstr("the model has 3 units, fewer than its 4 virtual stages"));
  EXPECT_THAT(config_error([] { balanced_partition(std::vector<std::uint64_t>{5, 5}, 3); }),
              HasSubstr("2 units, fewer than its 3 virtual stages"));
  EXPECT_THAT(config_error([] { explicit_partition({1, 1}, 1, 2); }),
              HasSubstr("1 unit, fewer than its 2 virtual stages"));
}

TEST(Partition, ByParametersMinimizesTheLargestStage) {
  // A GPT-like model: a large embedding, equal blocks, a small head (ln_f only; tied weights).
  const std::vector<std::uint64_t> parameters = {1000, 100, 100, 100, 100, 100, 100, 2};
  // Two pipeline stages: the embedding alone is 1000, the rest 602.
  EXPECT_THAT(balanced_partition(parameters, 2), ElementsAre(1, 7));
  // Equal blocks split evenly, the ties going to the earlier pipeline stage.
  EXPECT_THAT(balanced_partition(std::vector<std::uint64_t>{4, 4, 4, 4, 4, 4}, 3),
              ElementsAre(2, 2, 2));
  EXPECT_THAT(balanced_partition(std::vector<std::uint64_t>{1, 1, 1, 1, 1, 1, 1}, 3),
              ElementsAre(3, 3, 1));
}

TEST(Partition, BalancedEqualsTheBestOfEveryContiguousSplit) {
  // Small cases exhaustively, with costs that depend on the pipeline stage (as memory's do: a
  // pipeline stage with more micro-batches in flight pays more for each unit's activations).
  std::uint64_t seed = 12345;
  auto next = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (seed >> 33) % 50;
  };
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t units = 1 + next() % 9;
    const int pipeline_stages = 1 + static_cast<int>(next() % std::min<std::size_t>(units, 4));
    std::vector<std::uint64_t> fixed(units), activations(units);
    for (std::size_t u = 0; u < units; ++u) {
      fixed[u] = next();
      activations[u] = next();
    }
    const UnitCost cost = [&](int v, std::size_t u) {
      return fixed[u] + static_cast<std::uint64_t>(pipeline_stages - v) * activations[u];
    };
    std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
    std::vector<std::size_t> prefix;
    every_split(units, pipeline_stages, prefix, [&](const std::vector<std::size_t>& split) {
      best = std::min(best, largest_stage(split, cost));
    });
    const std::vector<std::size_t> found = balanced_partition(units, pipeline_stages, cost);
    ASSERT_EQ(found.size(), static_cast<std::size_t>(pipeline_stages));
    EXPECT_EQ(std::accumulate(found.begin(), found.end(), std::size_t{0}), units);
    EXPECT_TRUE(std::none_of(found.begin(), found.end(), [](std::size_t n) { return n == 0; }));
    EXPECT_EQ(largest_stage(found, cost), best) << "trial " << trial;
  }
}

TEST(Partition, MemoryCostsMoveUnitsOffTheFirstStage) {
  // Eight equal units, each 10 bytes of state and 10 of activations per micro-batch in flight;
  // 1F1B on 2 pipeline stages holds 2 micro-batches on stage 0 and 1 on stage 1: a unit costs 30
  // there and 20 here, so stage 0 takes 3 units (90) and stage 1 five (100), not 4 and 4 (120, 80).
  const UnitCost cost = [](int v, std::size_t) -> std::uint64_t { return 10 + 10 * (2 - v); };
  EXPECT_THAT(balanced_partition(8, 2, cost), ElementsAre(3, 5));
}

TEST(Partition, ZeroCostsStillLeaveNoStageEmpty) {
  EXPECT_THAT(balanced_partition(std::vector<std::uint64_t>{0, 0, 0, 0}, 3), ElementsAre(2, 1, 1));
}

TEST(Partition, HugeCostsSaturateInsteadOfWrapping) {
  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max() / 2;
  EXPECT_THAT(balanced_partition(std::vector<std::uint64_t>{huge, huge, huge, 1}, 2),
              ElementsAre(2, 2));
}

TEST(Partition, ExplicitListIsCheckedAgainstTheModel) {
  EXPECT_THAT(explicit_partition({3, 3, 2}, 8, 3), ElementsAre(3, 3, 2));
  EXPECT_EQ(config_error([] { explicit_partition({3, 3, 1}, 8, 3); }),
            "pipeline.partition: the list sums to 7 units, but the model has 8 (units would be "
            "dropped)");
  EXPECT_EQ(config_error([] { explicit_partition({3, 4, 2}, 8, 3); }),
            "pipeline.partition: the list sums to 9 units, but the model has 8");
  EXPECT_EQ(config_error([] { explicit_partition({4, 0, 4}, 8, 3); }),
            "pipeline.partition: [1] is 0: virtual stage 1 would hold no unit; every virtual "
            "stage needs at least one");
  EXPECT_THAT(config_error([] {
                explicit_partition({4, 4}, 8, 4);
              }),
              HasSubstr("lists 2 entries, not one per virtual stage (4"));
}

TEST(Partition, BoundariesAreTheRunningSum) {
  EXPECT_THAT(partition_boundaries({3, 3, 2}), ElementsAre(0, 3, 6, 8));
  EXPECT_EQ(partition_method_name(PartitionMethod::kMemory), "memory");
}

}  // namespace
}  // namespace zest
