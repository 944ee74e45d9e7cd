// Internal to the `mpi` backend (includes <mpi.h>): the state every enqueued operation of one
// MpiCommunicator shares, and what its collectives (mpi_communicator_mpi.cc) and its groups and
// point-to-point transfers (mpi_groups_mpi.cc) both use. Only *_mpi.cc files include it.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "runtime/mpi_check.h"
#include "runtime/mpi_process.h"
#include "runtime/mpi_communicator.h"

namespace zest {

namespace mpi_detail {

using Clock = std::chrono::steady_clock;

enum class Op : std::uint64_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };

inline const char* op_name(Op op) {
  switch (op) {
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllReduce: return "all_reduce";
    case Op::kBroadcast: return "broadcast";
    case Op::kBarrier: return "barrier";
  }
  return "?";
}

// What this rank passed to one collective: enough to describe it and to check that every rank
// called the same thing.
struct Call {
  Op op = Op::kBarrier;
  std::uint64_t sequence = 0;
  std::size_t count = 0;
  DType dtype = DType::kFloat32;
  Reduction reduction = Reduction::kSum;
  int root = 0;
  // For errors: the caller's name for it (name_next), or empty for describe(); its label; the
  // step its rank was in when it was issued.
  std::string name = {};
  std::string label = {};
  std::int64_t step = 0;

  // The fields every rank must agree on, as exchanged by the agreement check.
  static constexpr int kSignatureLength = 5;
  std::array<std::uint64_t, kSignatureLength> signature() const {
    return {static_cast<std::uint64_t>(op), count, static_cast<std::uint64_t>(dtype),
            static_cast<std::uint64_t>(reduction), static_cast<std::uint64_t>(root)};
  }
  static Call from_signature(std::uint64_t sequence, const std::uint64_t* words) {
    return {static_cast<Op>(words[0]), sequence, static_cast<std::size_t>(words[1]),
            static_cast<DType>(words[2]), static_cast<Reduction>(words[3]),
            static_cast<int>(words[4])};
  }
  // "all_reduce #12 (1000 x bf16, mean)", with the label if it has one.
  std::string describe() const {
    if (!name.empty()) return name;
    return describe_collective(op_name(op), sequence, count, dtype, reduction, root, label);
  }
};


// fp32 buffers a collective stages through. Owned by the enqueued closure, and kept alive past
// a timeout (MPI may still write into them).
struct Scratch {
  std::vector<float> send;
  std::vector<float> recv;
  std::array<std::uint64_t, Call::kSignatureLength> signature{};  // this rank's, sent
  std::vector<std::uint64_t> signatures;  // every rank's, all-gathered by the agreement check
};


// The communicators a Shared uses, each duplicated from `base` (collective over its ranks).
std::shared_ptr<MpiCommunicator::Shared> make_shared_state(MPI_Comm base,
                                                           std::chrono::milliseconds timeout,
                                                           std::string name,
                                                           std::vector<int> world_ranks);

// `count` as MPI's int, or a kUsage Error naming `op`.
int checked_count(std::size_t count, const char* op);

// Note: collectives are matched across ranks by host order, as in the local backend, but MPI
// matches nonblocking collectives on one communicator by the order they are started. Starting
// them strictly in host order would make a gather issued on `prefetch` wait for a
// reduce-scatter issued just before it on `comm` that is still waiting for compute — and lose
// the overlap. So collective s goes on lane s mod kLanes, one duplicated communicator each, and
// waits only for collective s − kLanes to have started: the order on every lane is the host
// order on every rank, and up to kLanes − 1 later collectives may start past a stalled one.
// Waiting only on earlier-issued collectives cannot deadlock: anything an earlier collective
// waits for was itself enqueued earlier.
constexpr int kLanes = 16;

}  // namespace mpi_detail

struct MpiCommunicator::Shared {
  using Call = mpi_detail::Call;
  using Clock = mpi_detail::Clock;
  using Scratch = mpi_detail::Scratch;
  static constexpr int kLanes = mpi_detail::kLanes;

  std::vector<MPI_Comm> lanes;
  MPI_Comm control = MPI_COMM_NULL;  // splits only: host-side, never a stream's
  MPI_Comm transfers = MPI_COMM_NULL;  // point to point only
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  std::string name;              // the group's, for errors; empty: the world
  std::vector<int> world_ranks;  // each rank's in the world, for errors
  std::uint64_t next_split = 0;

  std::mutex mutex;
  std::condition_variable turn_changed;
  std::vector<std::uint64_t> next_on_lane;  // the next collective each lane may start
  std::string broken;                       // non-empty: why every later collective fails at once
  ErrorKind broken_kind = ErrorKind::kInternal;
  std::vector<std::shared_ptr<Scratch>> abandoned;  // of collectives MPI may still complete

  ~Shared() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Comm& lane : lanes) MPI_Comm_free(&lane);
    for (MPI_Comm* comm : {&control, &transfers}) {
      if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
    }
  }

  int world_rank(int group_rank) const {
    return world_ranks.empty() ? group_rank : world_ranks[static_cast<std::size_t>(group_rank)];
  }
  std::string in_group() const { return name.empty() ? "" : " in the " + name; }

  MPI_Comm lane_of(const Call& call) const {
    return lanes[static_cast<std::size_t>(call.sequence % kLanes)];
  }

  std::string where(const Call& call) const {
    if (!name.empty()) {
      return call.describe() + at_step(call.step) + " on rank " +
             std::to_string(world_rank(rank)) + in_group();
    }
    return call.describe() + at_step(call.step) + " on rank " + std::to_string(rank) + " of " +
           std::to_string(world_size);
  }

  // Records the first failure; later collectives fail at once with it.
  void break_with(ErrorKind kind, const std::string& reason) {
    {
      std::lock_guard lock(mutex);
      if (broken.empty()) {
        broken = reason;
        broken_kind = kind;
      }
    }
    turn_changed.notify_all();
  }

  // Blocks until the collective issued kLanes before `call` on this rank has started.
  void wait_for_turn(const Call& call) {
    const std::size_t lane = static_cast<std::size_t>(call.sequence % kLanes);
    std::unique_lock lock(mutex);
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (!broken.empty()) {
        throw Error(ErrorKind::kPeerFailure,
                    where(call) + ": not started, the communicator failed earlier: " + broken);
      }
      if (next_on_lane[lane] == call.sequence) return;
      if (turn_changed.wait_until(lock, deadline) == std::cv_status::timeout &&
          next_on_lane[lane] != call.sequence && broken.empty()) {
        const std::string message =
            where(call) + ": timed out after " + timeout_text() + " waiting for collective #" +
            std::to_string(next_on_lane[lane]) +
            ", issued earlier on this rank, to start on its stream; that stream is stalled "
            "(world.timeout_s sets the limit)";
        lock.unlock();
        break_with(ErrorKind::kCommTimeout, message);
        throw Error(ErrorKind::kCommTimeout, message);
      }
    }
  }

  void pass_turn(const Call& call) {
    {
      std::lock_guard lock(mutex);
      next_on_lane[static_cast<std::size_t>(call.sequence % kLanes)] += kLanes;
    }
    turn_changed.notify_all();
  }

  std::string timeout_text() const { return seconds_text(timeout); }

  // Polls `request` until it completes. Past the deadline: a kCommTimeout naming the collective,
  // or saying `timeout_message` when one is given. `status`: where the completion's goes.
  void complete(MPI_Request& request, const Call& call, const char* what,
                const std::shared_ptr<Scratch>& scratch, const std::string& timeout_message = {},
                MPI_Status* status = MPI_STATUS_IGNORE) {
    const auto started = Clock::now();
    const auto deadline = started + timeout;
    // Note: Open MPI progresses nonblocking collectives only inside MPI calls, so the waiting
    // stream polls. It yields at first (short collectives finish within microseconds), then
    // sleeps briefly, so that waiting ranks leave the cores to ranks still computing.
    constexpr auto kSpin = std::chrono::microseconds(200);
    constexpr auto kNap = std::chrono::microseconds(20);
    for (;;) {
      int done = 0;
      const int code = MPI_Test(&request, &done, status);
      if (code != MPI_SUCCESS) fail(call, what, code);
      if (done) return;
      const auto now = Clock::now();
      if (now >= deadline) {
        const std::string message =
            !timeout_message.empty()
                ? timeout_message
                : where(call) + ": timed out after " + timeout_text() +
                      " waiting for the other ranks; a rank is stalled, failed or skipped the "
                      "collective (world.timeout_s sets the limit)";
        {
          std::lock_guard lock(mutex);
          abandoned.push_back(scratch);
        }
        break_with(ErrorKind::kCommTimeout, message);
        throw Error(ErrorKind::kCommTimeout, message);
      }
      if (now - started < kSpin) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(kNap);
      }
    }
  }

  [[noreturn]] void fail(const Call& call, const char* what, int code) {
    try {
      mpi::check(code, what, __FILE__, __LINE__);
    } catch (const Error& error) {
      const std::string message = where(call) + ": " + error.what();
      break_with(error.kind(), message);
      throw Error(error.kind(), message);
    }
    throw Error(ErrorKind::kInternal, "mpi::check accepted a failing code");
  }

  // Every rank all-gathers every rank's call; all must match. Runs on the call's lane while holding
  // its turn, so the check and the collective are started back to back on every rank.
  // Note: this costs one small all-gather's latency per collective (tens of microseconds on
  // one machine). It buys the interface's promise that a mismatch is an Error naming both
  // calls, where MPI itself would truncate, hang until the timeout, or reduce garbage.
  void check_agreement(const Call& call, const std::shared_ptr<Scratch>& scratch) {
    scratch->signature = call.signature();
    scratch->signatures.assign(static_cast<std::size_t>(world_size) * Call::kSignatureLength, 0);
    MPI_Request request = MPI_REQUEST_NULL;
    const int code =
        MPI_Iallgather(scratch->signature.data(), Call::kSignatureLength, MPI_UINT64_T,
                       scratch->signatures.data(), Call::kSignatureLength, MPI_UINT64_T,
                       lane_of(call), &request);
    if (code != MPI_SUCCESS) fail(call, "MPI_Iallgather (agreement check)", code);
    complete(request, call, "MPI_Test (agreement check)", scratch);
    const std::uint64_t* first = scratch->signatures.data();
    for (int r = 0; r < world_size; ++r) {
      const std::uint64_t* theirs = first + static_cast<std::size_t>(r) * Call::kSignatureLength;
      if (std::equal(theirs, theirs + Call::kSignatureLength, first)) continue;
      const std::string message =
          "collective mismatch: rank " + std::to_string(world_rank(0)) + " called " +
          Call::from_signature(call.sequence, first).describe() + " but rank " +
          std::to_string(world_rank(r)) + " called " +
          Call::from_signature(call.sequence, theirs).describe() + in_group() +
          "; every rank must call the same collectives in the same order";
      break_with(ErrorKind::kCommMismatch, message);
      throw Error(ErrorKind::kCommMismatch, message);
    }
  }
};

}  // namespace zest
