#include "runtime/wait_board.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

namespace zest {

WaitBoard::Posted::Posted(WaitBoard* board, int world_rank, std::vector<int> peers)
    : board_(board) {
  if (board_) id_ = board_->post(world_rank, std::move(peers));
}

WaitBoard::Posted::~Posted() {
  if (board_) board_->remove(id_);
}

std::uint64_t WaitBoard::post(int world_rank, std::vector<int> peers) {
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_id_++;
  waits_.emplace(id, std::make_pair(world_rank, std::move(peers)));
  return id;
}

void WaitBoard::remove(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  waits_.erase(id);
}

std::vector<int> WaitBoard::ends_of_chains(int waiter, const std::vector<int>& peers) const {
  std::lock_guard lock(mutex_);
  std::map<int, std::set<int>> waits_for;
  for (const auto& [id, wait] : waits_) {
    waits_for[wait.first].insert(wait.second.begin(), wait.second.end());
  }
  std::set<int> seen = {waiter};
  std::set<int> ends;
  std::vector<int> next(peers.begin(), peers.end());
  while (!next.empty()) {
    const int rank = next.back();
    next.pop_back();
    if (!seen.insert(rank).second) continue;
    const auto found = waits_for.find(rank);
    if (found == waits_for.end()) {
      ends.insert(rank);
      continue;
    }
    next.insert(next.end(), found->second.begin(), found->second.end());
  }
  if (ends.empty()) ends.insert(peers.begin(), peers.end());
  return {ends.begin(), ends.end()};
}

std::string chain_text(const WaitBoard* board, int waiter, const std::vector<int>& peers) {
  if (board == nullptr) return {};
  std::vector<int> ends = board->ends_of_chains(waiter, peers);
  std::vector<int> sorted = peers;
  std::sort(sorted.begin(), sorted.end());
  if (ends == sorted) return {};
  if (sorted.size() == 1) {
    return fmt::format("rank {} waits in turn for rank(s) {}", sorted[0], fmt::join(ends, ", "));
  }
  return fmt::format("rank(s) {} wait in turn for rank(s) {}", fmt::join(sorted, ", "),
                     fmt::join(ends, ", "));
}

}  // namespace zest
