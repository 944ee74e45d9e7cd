// The `local` backend: ranks are threads of one process and peers' buffers are read directly
// from shared memory. Collectives are matched across ranks by the order each rank issues them
// (its host-side sequence number), not by the order streams happen to run them, so
// collectives enqueued on different streams (comm and prefetch) cannot be paired wrongly.
// Groups split from a group (split) and point-to-point transfers (send / receive) are matched
// the same way. A failure anywhere — a rank that dies, times out or finishes early — reaches the
// groups split from the one it happened in, so no group's ranks wait out a timeout for a rank
// that is gone. Invariant: a communicator is driven by one host thread (its rank's).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "runtime/communicator.h"
#include "runtime/trace.h"
#include "runtime/wait_board.h"

namespace zest {

// What one rank passed to one collective.
struct LocalCall {
  std::string op;  // "all_gather", ...
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  Reduction reduction = Reduction::kSum;
  int root = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  // For errors: the collective as its caller knows it (describe_collective, or what name_next
  // gave), and the step its rank was in when it was issued.
  std::string name = {};
  std::int64_t step = 0;
  std::string label = {};  // point to point: the caller's label
};

// The state all ranks of one local group share.
class LocalGroup {
 public:
  // `name` and `world_ranks` (each rank's rank in the world) are for a group split from another;
  // empty: the world itself.
  // `board`: where the world's ranks post their waits (wait_board.h); a group split from this
  // one shares it. Null: a new one.
  LocalGroup(int world_size, std::chrono::milliseconds timeout, std::string name = {},
             std::vector<int> world_ranks = {}, std::shared_ptr<WaitBoard> board = nullptr);

  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const std::string& name() const { return name_; }
  int world_rank(int rank) const { return world_ranks_.empty() ? rank : world_ranks_[rank]; }

  // Marks the group failed because of `rank`: every collective waiting now or called later fails
  // at once with `reason`, instead of waiting out its timeout. The first call is the cause: it
  // alone reaches the failure observer, as an Error of `kind`.
  void poison(int rank, ErrorKind kind, const std::string& reason);
  // Called (once, on the thread that poisons) with the group's first failure, when it happens:
  // how a World learns which rank failed first, and when, while other ranks still wait. Set it
  // before any rank runs.
  void set_failure_observer(std::function<void(int rank, const Error& failure)> observer) {
    observer_ = std::move(observer);
  }
  // Marks `rank` as finished: a collective still waiting for it fails at once.
  void depart(int rank);

  // Phase one of collective `sequence`: posts `call` and waits until every rank has posted.
  // Returns all ranks' calls, checked to agree. Throws on timeout, poison or mismatch; a rank
  // that gives up withdraws its call, so no rank arriving later reads its buffers.
  const std::vector<LocalCall>& arrive(int rank, std::uint64_t sequence, const LocalCall& call);
  // Phase two, after arrive() returned: marks this rank done with every rank's buffers
  // (`moved`: its part of the collective succeeded) and waits until every rank is, whatever
  // fails meanwhile. Throws kPeerFailure when another rank's part failed. A peer that has not
  // finished within the timeout fails the group (a kCommTimeout naming it), but this rank
  // still waits: the peer may be reading its buffers, which the caller frees next.
  void leave(int rank, std::uint64_t sequence, bool moved = true);

  // Point to point, transfer `sequence` from rank `from` to rank `to`. The sender's side posts
  // `call.send` and waits until the receiver has copied it; the receiver's waits for the post,
  // checks that count and dtype agree and copies into `call.recv`. Either fails (and poisons
  // the group) on timeout, a mismatch, or a peer that failed or finished first.
  void send(int from, int to, std::uint64_t sequence, const LocalCall& call);
  void receive(int from, int to, std::uint64_t sequence, const LocalCall& call);

  // Split `sequence` of this group (Communicator::split): waits for every rank, then makes one
  // group per color, each failing when this one does. A negative color: no group.
  struct Membership {
    std::shared_ptr<LocalGroup> group;
    int rank = -1;
  };
  Membership split(int rank, std::uint64_t sequence, int color, int key, const std::string& name,
                   std::chrono::milliseconds timeout);

 private:
  struct Meeting {
    std::vector<LocalCall> calls;
    std::vector<bool> arrived;
    std::vector<bool> finished;
    int arrived_count = 0;
    int finished_count = 0;
    int departed_count = 0;  // ranks that have left phase two; the last one erases the meeting
    bool withdrawn = false;  // a rank gave up in phase one: the meeting never completes
    bool move_failed = false;
    // Its ranks' waits: notified when the last rank arrives or finishes, and by
    // wake_everyone_locked(). One per meeting: a group-wide one woke every rank's comm and
    // prefetch workers, in whatever meeting, at each arrival (~70 wake-ups per stream a step in
    // a 4-rank GPT run), each taking a core from compute.
    std::condition_variable changed;
  };

  // Phase one's wait: until every rank has arrived. Throws (and poisons) on timeout, poison or a
  // departed peer, withdrawing the meeting first.
  template <typename Done>
  void wait_for_arrivals(std::unique_lock<std::mutex>& lock, int rank, std::uint64_t sequence,
                         Done done);
  // "all_reduce #4 (3 x fp32, sum) 'step loss' at step 2 on rank 0": the call, for errors.
  std::string where(int rank, const LocalCall& call) const;
  void check_agreement(const Meeting& meeting) const;

  struct Transfer {
    LocalCall send;
    bool sent = false;
    bool claimed = false;    // the receiver is copying: the sender may no longer give up
    bool taken = false;      // copied: the sender's buffer is free
    bool withdrawn = false;  // a side gave up: the other erases the transfer and fails
    std::string mismatch;    // non-empty: the receiver found count or dtype differ
  };
  struct Splitting {
    std::vector<int> colors, keys;
    std::vector<std::string> names;
    std::vector<std::chrono::milliseconds> timeouts;
    std::vector<bool> arrived;
    int arrived_count = 0;
    int taken_count = 0;
    bool done = false;
    std::vector<Membership> result;
  };
  // Wakes every wait of the group, of every meeting and transfer (a failure or departure).
  void wake_everyone_locked();
  // The failure of the group this one was split from, or of a rank in it, reaching this one.
  void poison_from_parent(const std::string& reason);
  void depart_world_rank(int world_rank);
  std::vector<std::shared_ptr<LocalGroup>> live_children();
  std::string world_rank_list(const std::vector<int>& ranks) const;
  std::vector<int> world_ranks_of(const std::vector<int>& ranks) const;
  // A transfer's wait of `rank` for `peer`, posted on the board while it blocks.
  std::cv_status wait_for_peer(std::unique_lock<std::mutex>& lock, int rank, int peer,
                               std::chrono::steady_clock::time_point deadline);
  // "rank 1 is stalled or never sends it", or, when rank 1 only waits in turn, the chain of
  // waits to the rank(s) it ends at (wait_board.h).
  std::string stalled_peer_text(int rank, int peer, std::string_view otherwise) const;
  std::string in_group() const;

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;  // transfers, splits and failures; meetings have their own
  std::map<std::uint64_t, Meeting> meetings_;
  std::vector<bool> rank_departed_;
  bool poisoned_ = false;
  std::string poison_reason_;
  std::function<void(int, const Error&)> observer_;
  const std::string name_;
  const std::vector<int> world_ranks_;
  std::map<std::tuple<int, int, std::uint64_t>, Transfer> transfers_;
  std::map<std::uint64_t, Splitting> splits_;
  std::vector<std::weak_ptr<LocalGroup>> children_;
  const std::shared_ptr<WaitBoard> board_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank);

  // Debug: sleep this long before each collective starts (see WorldOptions::collective_delay).
  void set_delay(std::chrono::milliseconds delay) { delay_ = delay; }
  // Records each collective as a slice on its stream's track (null: no tracing).
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }
  std::chrono::milliseconds timeout() const override { return group_->timeout(); }

  void all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                  DType dtype) override;
  void reduce_scatter(Stream& stream, const void* send, void* recv, std::size_t count,
                      DType dtype, Reduction reduction) override;
  void all_reduce(Stream& stream, const void* send, void* recv, std::size_t count, DType dtype,
                  Reduction reduction) override;
  void broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype, int root) override;
  void barrier(Stream& stream) override;
  void send(Stream& stream, const void* data, std::size_t count, DType dtype, int peer) override;
  void receive(Stream& stream, void* data, std::size_t count, DType dtype, int peer) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      std::chrono::milliseconds timeout = {}) override;
  std::string group_name() const override { return group_->name(); }
  int world_rank_of(int rank) const override { return group_->world_rank(rank); }
  void label_next(const char* label) override { label_ = label == nullptr ? "" : label; }
  void name_next(const std::string& caller) override { name_ = caller; }
  void begin_step(std::int64_t step) override { step_ = step; }

  // Makes `world_size` communicators over one new group.
  static std::vector<std::unique_ptr<LocalCommunicator>> create_group(
      int world_size, std::chrono::milliseconds timeout);
  LocalGroup& group() { return *group_; }

 private:
  // Enqueues a collective on `stream`: the meeting, then `move` (this rank's share of the data
  // movement, given every rank's call), then the second meeting.
  void enqueue_collective(Stream& stream, LocalCall call,
                          void (*move)(int rank, const std::vector<LocalCall>& calls));

  std::shared_ptr<LocalGroup> group_;
  const int rank_;
  // Checks `peer` for a transfer: a rank of the group, not this one.
  void check_peer(int peer, const char* op) const;

  std::uint64_t next_sequence_ = 0;
  std::uint64_t next_split_ = 0;
  std::vector<std::uint64_t> next_send_;     // per peer
  std::vector<std::uint64_t> next_receive_;  // per peer
  std::chrono::milliseconds delay_{0};
  TraceRecorder* trace_ = nullptr;
  std::string label_;  // for the next collective
  std::string name_;   // for the next collective: the caller's, when a wrapper issues it
  std::int64_t step_ = 0;
};

}  // namespace zest
