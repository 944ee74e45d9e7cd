// raise_divergence: a step whose overflow flag was summed over several groups (a pipeline's
// stages, a tensor-parallel group) stops every rank with the same kDivergence message naming the
// rank and unit where the non-finite gradient arose. The ranks that found it are made late here:
// a rank whose own units were finite must still wait for their report and name them, never raise
// a guess of its own first (a World keeps the first failure it is offered).
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "engine/divergence_report.h"
#include "tests/runtime/local_world_support.h"

namespace zest {
namespace {

// Runs 4 ranks; `finding_of(rank)` is each rank's finding, and the ranks with one are 300 ms
// late. `two_groups`: the report goes over each "tensor index"'s ranks (0, 2 and 1, 3), then
// over the "tensor-parallel groups" (0, 1 and 2, 3), as a tensor-parallel step's flag is summed.
// Returns each rank's error (kind name and message).
std::vector<std::string> errors_of(const std::function<NonFiniteFinding(int)>& finding_of,
                                   bool two_groups) {
  std::vector<std::string> errors(4);
  std::mutex mutex;
  testing::run_world(4, [&](RankContext& context) {
    std::unique_ptr<Communicator> index;
    std::unique_ptr<Communicator> tensor;
    std::vector<Communicator*> groups{&context.communicator};
    if (two_groups) {
      index = context.communicator.split(context.rank % 2, context.rank, "tensor index");
      tensor = context.communicator.split(context.rank / 2, context.rank, "tensor group");
      groups = {index.get(), tensor.get()};
    }
    const NonFiniteFinding mine = finding_of(context.rank);
    if (mine.where != NonFiniteFinding::Where::kNowhere) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    std::string error = "no error";
    try {
      raise_divergence(context, groups, 7, DType::kFloat32, mine);
    } catch (const Error& thrown) {
      error = std::string(error_kind_name(thrown.kind())) + ": " + thrown.what();
    }
    std::lock_guard lock(mutex);
    errors[static_cast<std::size_t>(context.rank)] = error;
  });
  return errors;
}

NonFiniteFinding in_unit(const std::string& unit) { return {NonFiniteFinding::Where::kUnit, unit}; }

void expect_every_rank_says(const std::vector<std::string>& errors, const std::string& text) {
  EXPECT_EQ(std::set<std::string>(errors.begin(), errors.end()).size(), 1u)
      << errors[0] << " | " << errors[1] << " | " << errors[2] << " | " << errors[3];
  for (const std::string& error : errors) {
    EXPECT_EQ(error.rfind(error_kind_name(ErrorKind::kDivergence), 0), 0u) << error;
    EXPECT_NE(error.find(text), std::string::npos) << error;
  }
}

TEST(DivergenceReport, EveryRankNamesTheLateRankAndUnitWhereTheGradientWasNotFinite) {
  const auto errors =
      errors_of([](int rank) { return rank == 3 ? in_unit("layer4") : NonFiniteFinding{}; }, false);
  expect_every_rank_says(errors, "non-finite gradient at step 7 on rank 3, unit layer4 (fp32");
}

TEST(DivergenceReport, OverATensorIndexThenItsGroupEveryRankOfEveryGroupIsNamed) {
  const auto errors = errors_of(
      [](int rank) {
        if (rank == 1) return in_unit("block0.attention");
        if (rank == 2) return in_unit("head");
        return NonFiniteFinding{};
      },
      true);
  expect_every_rank_says(errors, "on rank 1, unit block0.attention; rank 2, unit head (");
}

TEST(DivergenceReport, AUnitIsNamedBeforeAReductionAndAReductionAloneIsSaidSo) {
  const auto named = errors_of(
      [](int rank) {
        if (rank == 0) return NonFiniteFinding{NonFiniteFinding::Where::kReduction, ""};
        return rank == 2 ? in_unit("layer1") : NonFiniteFinding{};
      },
      true);
  expect_every_rank_says(named, "on rank 2, unit layer1 (");
  const auto reduced = errors_of(
      [](int rank) {
        return rank == 1 ? NonFiniteFinding{NonFiniteFinding::Where::kReduction, ""}
                         : NonFiniteFinding{};
      },
      false);
  expect_every_rank_says(reduced, "non-finite gradient at step 7 in the reduced gradients (");
}

TEST(DivergenceReport, ALongUnitNameIsCutNotOverrun) {
  const std::string long_name(300, 'u');
  const auto errors = errors_of(
      [&](int rank) { return rank == 0 ? in_unit(long_name) : NonFiniteFinding{}; }, false);
  expect_every_rank_says(errors, "on rank 0, unit " + std::string(119, 'u') + " (");
}

}  // namespace
}  // namespace zest
