// Which world ranks each rank of a `local` world is waiting for, now: every group of the world
// (local_communicator.h) posts its ranks' waits here — a collective's missing ranks, a transfer's
// peer — so that a timeout can name the rank at the end of a chain of waits instead of a peer
// that only waits in turn. In a pipeline of four stages with pipeline stage 1 stalled, pipeline
// stage 3 waits for pipeline stage 2, which waits for pipeline stage 1: "rank 2 is stalled" would
// blame a healthy rank. Invariant: a wait is on the board exactly while its thread blocks (Posted's
// lifetime).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zest {

class WaitBoard {
 public:
  // A wait of `world_rank` for `peers` (world ranks), on the board until destroyed.
  class Posted {
   public:
    Posted(WaitBoard* board, int world_rank, std::vector<int> peers);
    ~Posted();
    Posted(const Posted&) = delete;
    Posted& operator=(const Posted&) = delete;

   private:
    WaitBoard* board_;  // null: nothing posted
    std::uint64_t id_ = 0;
  };

  // The ranks the chains of waits from `peers` end at: a peer that waits for nobody is one, and
  // a peer that waits is followed to whom it waits for. `waiter` and ranks on a cycle end no
  // chain; when no chain ends (every rank waits), `peers` themselves.
  std::vector<int> ends_of_chains(int waiter, const std::vector<int>& peers) const;

 private:
  std::uint64_t post(int world_rank, std::vector<int> peers);
  void remove(std::uint64_t id);

  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::pair<int, std::vector<int>>> waits_;  // id: (rank, peers)
  std::uint64_t next_id_ = 1;
};

// "rank 2 waits in turn for rank(s) 1" when the chains from `peers` end elsewhere than at
// `peers` themselves; empty otherwise (and with no board). For a timeout's message.
std::string chain_text(const WaitBoard* board, int waiter, const std::vector<int>& peers);

}  // namespace zest
