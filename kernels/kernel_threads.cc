#include "kernels/kernel_threads.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "kernels/blocked_loop.h"

namespace zest {
namespace {

std::atomic<int> budget{1};

}  // namespace

void set_kernel_threads(int threads) { budget.store(std::max(threads, 1)); }

int kernel_threads() { return budget.load(); }

void parallel_blocks(std::size_t count, std::size_t min_piece,
                     const std::function<void(std::size_t, std::size_t)>& body) {
  const std::size_t most = min_piece == 0 ? count : count / min_piece;
  const std::size_t pieces =
      std::clamp<std::size_t>(most, 1, static_cast<std::size_t>(kernel_threads()));
  if (pieces == 1) {
    if (count > 0) body(0, count);
    return;
  }
  // Note: threads are started per call rather than kept in a pool: callers choose min_piece as
  // milliseconds of work, against tens of microseconds to start and join a thread, and nothing
  // then lives between calls to be shut down or shared between ranks.
  // Piece k starts at k/pieces of the range, rounded down to a whole block.
  const auto start = [&](std::size_t k) {
    return k == pieces ? count : k * count / pieces / kVectorBlock * kVectorBlock;
  };
  std::vector<std::jthread> helpers;
  for (std::size_t k = 1; k < pieces; ++k) {
    const std::size_t offset = start(k);
    const std::size_t n = start(k + 1) - offset;
    if (n > 0) helpers.emplace_back([&body, offset, n] { body(offset, n); });
  }
  if (start(1) > 0) body(0, start(1));
}

}  // namespace zest
