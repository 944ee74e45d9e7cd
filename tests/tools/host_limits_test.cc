// Ranks as threads of one process are checked against the host before any of them starts: more
// threads than the system allows, or more memory than the host has, is one config error naming
// world.ranks, what the ranks need and the limit; a world that fits, processes and one rank pass.
#include "tools/common/host_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "resolve/resolved_config.h"
#include "tests/support/capture_error.h"

namespace zest {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TrainConfig gpt_on(int ranks, int micro_batch, const std::string& backend = "local") {
  json config = {
      {"model", {{"type", "gpt"}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"seq_len", 32}}},
      {"data", {{"type", "text"}, {"path", "unused.txt"}}},
      {"world", {{"ranks", ranks}, {"backend", backend}}},
      {"steps", 1},
      {"train_batch_size", ranks * micro_batch},
      {"train_micro_batch_size_per_gpu", micro_batch}};
  return parse_resolved_config(config);
}

// A host like the one the hostile run used: 24 GiB, pid_max 32768.
const HostLimits kSmallHost{32768, "kernel.pid_max", std::uint64_t{24} << 30};

TEST(HostLimits, MoreThreadsThanTheSystemAllowsAreRefusedNamingTheLimit) {
  const Error error =
      testing::capture_error([] { check_ranks_fit_host(gpt_on(65536, 1), kSmallHost); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), StartsWith("world.ranks: 65536 ranks as threads of one process need "
                                       "at least 262144 threads, more than this system allows "
                                       "(kernel.pid_max: 32768)"));
}

TEST(HostLimits, MoreMemoryThanTheHostHasIsRefusedNamingBoth) {
  HostLimits many_threads = kSmallHost;
  many_threads.threads = 0;  // unknown: only the memory is held against the ranks
  const Error error =
      testing::capture_error([&] { check_ranks_fit_host(gpt_on(65536, 1), many_threads); });
  EXPECT_EQ(error.kind(), ErrorKind::kConfig);
  EXPECT_THAT(error.what(), StartsWith("world.ranks: 65536 ranks as threads of one process need "
                                       "at least "));
  EXPECT_THAT(error.what(), HasSubstr("of host memory"));
  EXPECT_THAT(error.what(), HasSubstr("more than this host's 24.00 GiB"));
}

TEST(HostLimits, AWorldThatFitsProcessesAndOneRankPass) {
  EXPECT_NO_THROW(check_ranks_fit_host(gpt_on(4, 2), kSmallHost));
  EXPECT_NO_THROW(check_ranks_fit_host(gpt_on(1024, 1), kSmallHost));
  EXPECT_NO_THROW(check_ranks_fit_host(gpt_on(65536, 1, "mpi"), kSmallHost));
  EXPECT_NO_THROW(check_ranks_fit_host(gpt_on(1, 4), HostLimits{1, "x", 1}));
}

TEST(HostLimits, TheFloorGrowsWithRanksAndMicroBatch) {
  const RankFloor small = rank_floor(gpt_on(4, 1));
  EXPECT_EQ(small.threads, 16u);
  EXPECT_LT(small.bytes, rank_floor(gpt_on(8, 1)).bytes);
  EXPECT_LT(small.bytes, rank_floor(gpt_on(4, 64)).bytes);
}

}  // namespace
}  // namespace zest
