// Ranks as threads pinned to cores when they outnumber them (world.pin_ranks, ZEST_PIN_RANKS):
// which core each rank gets, and that the rank's own thread and its streams' workers all run
// there while the caller's thread stays free.
#include "runtime/core_pinning.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/world.h"

namespace zest {
namespace {

constexpr RankPinning kAuto = RankPinning::kAuto;

TEST(CorePinning, RanksGoRoundTheAllowedCoresWhenTheyOutnumberThem) {
  const std::vector<int> cores = {3, 5};
  std::vector<int> got;
  for (int rank = 0; rank < 5; ++rank) got.push_back(rank_core(rank, 5, cores, kAuto));
  EXPECT_EQ(got, (std::vector<int>{3, 5, 3, 5, 3}));
}

TEST(CorePinning, FewerRanksThanCoresArePinnedOnlyWhenAsked) {
  EXPECT_EQ(rank_core(1, 2, {0, 1, 2, 3}, kAuto), -1);
  EXPECT_EQ(rank_core(1, 2, {0, 1}, kAuto), -1);
  EXPECT_EQ(rank_core(1, 2, {0, 1, 2, 3}, RankPinning::kOn), 1);
}

TEST(CorePinning, OffWhenTurnedOffAndWithOneRankOrOneCore) {
  EXPECT_EQ(rank_core(1, 4, {0, 1}, RankPinning::kOff), -1);
  EXPECT_EQ(rank_core(0, 1, {0, 1}, RankPinning::kOn), -1);  // one rank has the machine
  EXPECT_EQ(rank_core(1, 4, {0}, RankPinning::kOn), -1);     // one core: nothing to choose
  EXPECT_EQ(rank_core(1, 4, {}, kAuto), -1);                 // unknown
}

TEST(CorePinning, TheEnvironmentSaysZeroForOffOneForOnAndAnythingElseIsAuto) {
  EXPECT_EQ(pinning_from_environment("0"), RankPinning::kOff);
  EXPECT_EQ(pinning_from_environment("1"), RankPinning::kOn);
  EXPECT_EQ(pinning_from_environment("auto"), kAuto);
  EXPECT_EQ(pinning_from_environment(""), kAuto);
  EXPECT_EQ(pinning_from_environment(nullptr), kAuto);
}

// Sets an environment variable for one test and restores it.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnvironment() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

// Per rank, the cores its thread and each of its streams' workers may use.
std::vector<std::vector<std::vector<int>>> cores_seen(int ranks,
                                                      RankPinning pinning = RankPinning::kAuto) {
  std::vector<std::vector<std::vector<int>>> seen(static_cast<std::size_t>(ranks));
  std::mutex mutex;
  WorldOptions options;
  options.ranks = ranks;
  options.pin_ranks = pinning;
  World world(options);
  world.run([&](RankContext& context) {
    std::vector<std::vector<int>> mine = {allowed_cores(), {}, {}, {}};
    context.compute.enqueue([&mine] { mine[1] = allowed_cores(); });
    context.comm.enqueue([&mine] { mine[2] = allowed_cores(); });
    context.prefetch.enqueue([&mine] { mine[3] = allowed_cores(); });
    context.synchronize();
    std::lock_guard lock(mutex);
    seen[static_cast<std::size_t>(context.rank)] = mine;
  });
  return seen;
}

TEST(CorePinning, EachRanksThreadsRunOnItsCoreWhenRanksOutnumberCores) {
  const std::vector<int> cores = allowed_cores();
  if (cores.size() < 2) GTEST_SKIP() << "needs two cores, has " << cores.size();
  ScopedEnvironment pin("ZEST_PIN_RANKS", "");  // the default
  const int ranks = static_cast<int>(cores.size()) + 2;  // more ranks than cores, as on a laptop
  const auto seen = cores_seen(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    const std::vector<int> expected = {cores[static_cast<std::size_t>(rank) % cores.size()]};
    for (const auto& thread : seen[static_cast<std::size_t>(rank)]) {
      EXPECT_EQ(thread, expected) << "rank " << rank;
    }
  }
  EXPECT_EQ(allowed_cores(), cores) << "the caller's thread stays unpinned";
  EXPECT_EQ(this_thread_core(), -1);
}

TEST(CorePinning, RanksKeepEveryCoreWhenTurnedOff) {
  const std::vector<int> cores = allowed_cores();
  if (cores.size() < 2) GTEST_SKIP() << "needs two cores";
  ScopedEnvironment pin("ZEST_PIN_RANKS", "0");
  for (const auto& rank : cores_seen(static_cast<int>(cores.size()) + 2)) {
    for (const auto& thread : rank) EXPECT_EQ(thread, cores);
  }
}

// world.pin_ranks: the options beat the environment, which speaks only where they say "auto".
TEST(CorePinning, TheWorldsOptionsBeatTheEnvironment) {
  const std::vector<int> cores = allowed_cores();
  if (cores.size() < 2) GTEST_SKIP() << "needs two cores";
  const int ranks = static_cast<int>(cores.size()) + 2;
  {
    ScopedEnvironment pin("ZEST_PIN_RANKS", "1");
    for (const auto& rank : cores_seen(ranks, RankPinning::kOff)) {
      for (const auto& thread : rank) EXPECT_EQ(thread, cores);
    }
  }
  ScopedEnvironment pin("ZEST_PIN_RANKS", "0");
  const auto seen = cores_seen(2, RankPinning::kOn);  // pinned even with a core for each rank
  for (int rank = 0; rank < 2; ++rank) {
    for (const auto& thread : seen[static_cast<std::size_t>(rank)]) {
      EXPECT_EQ(thread, std::vector<int>{cores[static_cast<std::size_t>(rank)]}) << "rank " << rank;
    }
  }
}

}  // namespace
}  // namespace zest
