// Splitting a kernel's range over the thread budget: every element in exactly one piece, pieces
// starting at multiples of the vector block, no more pieces than threads, none much shorter than
// asked for, and a range too short to split run whole on the calling thread.
#include "kernels/kernel_threads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/blocked_loop.h"

namespace zest {
namespace {

struct Split {
  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  std::vector<std::thread::id> threads;
  std::vector<int> covered;
};

Split split(std::size_t count, std::size_t min_piece, int threads) {
  set_kernel_threads(threads);
  Split result;
  result.covered.assign(count, 0);
  std::mutex mutex;
  parallel_blocks(count, min_piece, [&](std::size_t offset, std::size_t n) {
    for (std::size_t i = offset; i < offset + n; ++i) ++result.covered[i];  // pieces are disjoint
    const std::lock_guard lock(mutex);
    result.pieces.emplace_back(offset, n);
    result.threads.push_back(std::this_thread::get_id());
  });
  set_kernel_threads(1);
  return result;
}

TEST(KernelThreads, TheBudgetIsOneByDefaultAndAtLeastOne) {
  EXPECT_EQ(kernel_threads(), 1);
  set_kernel_threads(0);
  EXPECT_EQ(kernel_threads(), 1);
  set_kernel_threads(4);
  EXPECT_EQ(kernel_threads(), 4);
  set_kernel_threads(1);
}

TEST(KernelThreads, EveryElementIsInExactlyOnePiece) {
  for (std::size_t count : {1000u, 1001u, 4096u, 100003u}) {
    for (int threads : {1, 2, 3, 4, 7}) {
      SCOPED_TRACE(testing::Message() << count << " elements, " << threads << " threads");
      const Split s = split(count, 100, threads);
      for (std::size_t i = 0; i < count; ++i) ASSERT_EQ(s.covered[i], 1) << "element " << i;
      EXPECT_LE(s.pieces.size(), static_cast<std::size_t>(threads));
      for (const auto& [offset, n] : s.pieces) {
        EXPECT_EQ(offset % kVectorBlock, 0u);
        EXPECT_GE(n + kVectorBlock, s.pieces.size() == 1 ? 1u : 100u);
      }
    }
  }
}

TEST(KernelThreads, PiecesRunOnSeveralThreads) {
  const Split s = split(1 << 16, 1 << 10, 4);
  ASSERT_EQ(s.pieces.size(), 4u);
  std::vector<std::thread::id> distinct = s.threads;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_EQ(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 4);
}

TEST(KernelThreads, AShortRangeRunsWholeOnTheCallingThread) {
  const Split s = split(1999, 1000, 4);  // two pieces would be shorter than 1000
  ASSERT_EQ(s.pieces.size(), 1u);
  EXPECT_EQ(s.pieces[0], std::make_pair(std::size_t{0}, std::size_t{1999}));
  EXPECT_EQ(s.threads[0], std::this_thread::get_id());
  EXPECT_TRUE(split(0, 1000, 4).pieces.empty());
}

}  // namespace
}  // namespace zest
