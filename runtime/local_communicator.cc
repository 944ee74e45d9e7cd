#include "runtime/local_communicator.h"

#include <cstring>
#include <thread>
#include <utility>

#include "base/error.h"
#include "runtime/device_mesh.h"
#include "runtime/host_reduction.h"

namespace zest {

namespace {

const char* byte_pointer(const void* p, std::size_t offset) {
  return static_cast<const char*>(p) + offset;
}

// The bytes a collective moves, as nccl-tests count its size: the whole gathered or scattered
// buffer for all_gather and reduce_scatter, the buffer for all_reduce and broadcast.
std::size_t moved_bytes(const LocalCall& call, int world_size) {
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  if (call.op == "all_gather" || call.op == "reduce_scatter") return bytes * world_size;
  return bytes;
}

}  // namespace

LocalGroup::LocalGroup(int world_size, std::chrono::milliseconds timeout, std::string name,
                       std::vector<int> world_ranks, std::shared_ptr<WaitBoard> board)
    : world_size_(world_size),
      timeout_(timeout),
      rank_departed_(world_size, false),
      name_(std::move(name)),
      world_ranks_(std::move(world_ranks)),
      board_(board ? std::move(board) : std::make_shared<WaitBoard>()) {
  if (world_size < 1) {
    throw Error(ErrorKind::kUsage, "a local group needs at least 1 rank, got " +
                                       std::to_string(world_size));
  }
}

void LocalGroup::poison(int rank, ErrorKind kind, const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (poisoned_) return;  // the first failure is the cause; later ones are its echoes
    poisoned_ = true;
    poison_reason_ = "rank " + std::to_string(world_rank(rank)) + " failed: " + reason;
    wake_everyone_locked();
  }
  for (const auto& child : live_children()) child->poison_from_parent(poison_reason_);
  if (observer_) observer_(rank, Error(kind, reason));
}

void LocalGroup::poison_from_parent(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (poisoned_) return;
    poisoned_ = true;
    poison_reason_ = reason;
    wake_everyone_locked();
  }
  for (const auto& child : live_children()) child->poison_from_parent(reason);
}

void LocalGroup::wake_everyone_locked() {
  changed_.notify_all();
  for (auto& [sequence, meeting] : meetings_) meeting.changed.notify_all();
}

std::vector<std::shared_ptr<LocalGroup>> LocalGroup::live_children() {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<LocalGroup>> live;
  for (const auto& child : children_) {
    if (auto group = child.lock()) live.push_back(std::move(group));
  }
  return live;
}

void LocalGroup::depart(int rank) {
  {
    std::lock_guard lock(mutex_);
    rank_departed_[rank] = true;
    wake_everyone_locked();
  }
  for (const auto& child : live_children()) child->depart_world_rank(world_rank(rank));
}

void LocalGroup::depart_world_rank(int world_rank) {
  for (int rank = 0; rank < world_size_; ++rank) {
    if (this->world_rank(rank) == world_rank) return depart(rank);
  }
}

std::string LocalGroup::world_rank_list(const std::vector<int>& ranks) const {
  return rank_list_text(world_ranks_of(ranks));
}

std::vector<int> LocalGroup::world_ranks_of(const std::vector<int>& ranks) const {
  std::vector<int> world;
  for (int rank : ranks) world.push_back(world_rank(rank));
  return world;
}

std::string LocalGroup::in_group() const { return name_.empty() ? "" : " in the " + name_; }

std::string LocalGroup::where(int rank, const LocalCall& call) const {
  return call.name + at_step(call.step) + " on rank " + std::to_string(world_rank(rank)) +
         in_group();
}

template <typename Done>
void LocalGroup::wait_for_arrivals(std::unique_lock<std::mutex>& lock, int rank,
                                   std::uint64_t sequence, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  Meeting& meeting = meetings_.at(sequence);
  const LocalCall& call = meeting.calls[rank];
  // Note: a rank that gives up withdraws the meeting while it still holds the lock, so a rank
  // arriving later never sees it complete and never reads the buffers of a rank that has gone
  // (and freed them): ASan caught a stalled rank copying from a timed-out peer's buffer.
  const auto give_up = [&](ErrorKind kind, const std::string& message) {
    meeting.withdrawn = true;
    lock.unlock();
    poison(rank, kind, message);
    throw Error(kind, message);
  };
  const auto not_arrived = [&] {
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (!meeting.arrived[r]) missing.push_back(r);
    }
    return missing;
  };
  for (;;) {
    // A collective every rank has completed succeeds even if a peer fails right after it:
    // that failure belongs to a later call, and reporting it here would hide this rank's own.
    if (done()) return;
    if (poisoned_) {
      meeting.withdrawn = true;
      throw Error(ErrorKind::kPeerFailure, where(rank, call) + ": " + poison_reason_);
    }
    std::vector<int> departed;
    for (int r = 0; r < world_size_; ++r) {
      if (!meeting.arrived[r] && rank_departed_[r]) departed.push_back(r);
    }
    if (!departed.empty()) {
      give_up(ErrorKind::kCommMismatch,
              where(rank, call) + ": rank(s) " + world_rank_list(departed) +
                  " finished without calling it; every rank must call the same collectives in "
                  "the same order");
    }
    std::cv_status status;
    {
      // Note: the ranks missing now; one arriving later wakes nobody, so the board may name it
      // until this wait ends (a chain through it is then only longer than it need be).
      const WaitBoard::Posted posted(board_.get(), world_rank(rank),
                                     world_ranks_of(not_arrived()));
      status = meeting.changed.wait_until(lock, deadline);
    }
    if (status == std::cv_status::timeout && !done() && !poisoned_) {
      // Note: read now, not before the wait: an arrival that leaves the meeting incomplete
      // wakes nobody, so a list made before the wait may name ranks that have come since.
      const std::vector<int> missing = world_ranks_of(not_arrived());
      const std::string chain = chain_text(board_.get(), world_rank(rank), missing);
      give_up(ErrorKind::kCommTimeout,
              where(rank, call) + ": timed out after " + seconds_text(timeout_) +
                  " waiting for rank(s) " + rank_list_text(missing) + (chain.empty() ? "" : "; ") +
                  chain + "; a rank is stalled or skipped the collective (world.timeout_s sets "
                  "the limit)");
    }
  }
}

const std::vector<LocalCall>& LocalGroup::arrive(int rank, std::uint64_t sequence,
                                                 const LocalCall& call) {
  std::unique_lock lock(mutex_);
  Meeting& meeting = meetings_[sequence];
  if (meeting.calls.empty()) {
    meeting.calls.resize(world_size_);
    meeting.arrived.assign(world_size_, false);
    meeting.finished.assign(world_size_, false);
  }
  meeting.calls[rank] = call;
  meeting.arrived[rank] = true;
  ++meeting.arrived_count;
  if (meeting.arrived_count == world_size_) meeting.changed.notify_all();
  wait_for_arrivals(lock, rank, sequence,
                    [&] { return meeting.arrived_count == world_size_ && !meeting.withdrawn; });
  try {
    check_agreement(meeting);
  } catch (const Error& error) {
    lock.unlock();
    poison(rank, error.kind(), error.what());
    throw;
  }
  return meeting.calls;
}

void LocalGroup::leave(int rank, std::uint64_t sequence, bool moved) {
  std::unique_lock lock(mutex_);
  Meeting& meeting = meetings_.at(sequence);
  meeting.finished[rank] = true;
  ++meeting.finished_count;
  if (!moved) meeting.move_failed = true;
  if (meeting.finished_count == world_size_) meeting.changed.notify_all();
  // Note: every rank arrived, so any may still be reading this rank's buffers: wait for all,
  // whatever else fails meanwhile. Giving up early on a poisoned group let the caller free a
  // buffer a peer was still copying from. A peer that stalls here past the timeout fails the
  // group, so that the World learns of it (and ends the process after its grace period), but
  // this rank waits on: only the process's end may free what the peer still reads.
  const auto all_finished = [&] { return meeting.finished_count == world_size_; };
  if (!meeting.changed.wait_for(lock, timeout_, all_finished)) {
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (!meeting.finished[r]) missing.push_back(r);
    }
    const std::string message =
        where(rank, meeting.calls[rank]) + ": timed out after " + seconds_text(timeout_) +
        " waiting for rank(s) " + world_rank_list(missing) +
        " to finish it; a rank is stalled (world.timeout_s sets the limit)";
    lock.unlock();
    poison(rank, ErrorKind::kCommTimeout, message);
    lock.lock();
    meeting.changed.wait(lock, all_finished);
  }
  const bool peer_failed = moved && meeting.move_failed;
  const std::string what = where(rank, meeting.calls[rank]) + ": " + poison_reason_;
  if (++meeting.departed_count == world_size_) meetings_.erase(sequence);
  if (peer_failed) throw Error(ErrorKind::kPeerFailure, what);
}

void LocalGroup::check_agreement(const Meeting& meeting) const {
  const LocalCall& first = meeting.calls[0];
  for (int r = 1; r < world_size_; ++r) {
    const LocalCall& call = meeting.calls[r];
    if (call.op != first.op || call.count != first.count || call.dtype != first.dtype ||
        call.reduction != first.reduction || call.root != first.root) {
      throw Error(ErrorKind::kCommMismatch,
                  "collective mismatch: rank " + std::to_string(world_rank(0)) + " called " +
                      first.name + " but rank " + std::to_string(world_rank(r)) + " called " +
                      call.name + in_group() +
                      "; every rank must call the same collectives in the same order");
    }
  }
}

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
    : group_(std::move(group)),
      rank_(rank),
      next_send_(static_cast<std::size_t>(group_->world_size()), 0),
      next_receive_(static_cast<std::size_t>(group_->world_size()), 0) {}

std::vector<std::unique_ptr<LocalCommunicator>> LocalCommunicator::create_group(
    int world_size, std::chrono::milliseconds timeout) {
  auto group = std::make_shared<LocalGroup>(world_size, timeout);
  std::vector<std::unique_ptr<LocalCommunicator>> communicators;
  for (int rank = 0; rank < world_size; ++rank) {
    communicators.push_back(std::make_unique<LocalCommunicator>(group, rank));
  }
  return communicators;
}

void LocalCommunicator::enqueue_collective(
    Stream& stream, LocalCall call, void (*move)(int rank, const std::vector<LocalCall>& calls)) {
  const std::uint64_t sequence = next_sequence_++;
  call.name = name_.empty() ? describe_collective(call.op, sequence, call.count, call.dtype,
                                                  call.reduction, call.root, label_)
                            : std::move(name_);
  call.step = step_;
  label_.clear();
  name_.clear();
  const std::string track = stream_role(stream.name());
  stream.enqueue([group = group_, rank = rank_, sequence, call = std::move(call), move,
                  delay = delay_, trace = trace_, track] {
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    const std::int64_t begin = trace ? TraceRecorder::now_us() : 0;
    const std::vector<LocalCall>& calls = group->arrive(rank, sequence, call);
    try {
      move(rank, calls);
    } catch (const std::exception& error) {
      const auto* zest_error = dynamic_cast<const Error*>(&error);
      group->poison(rank, zest_error ? zest_error->kind() : ErrorKind::kInternal, error.what());
      group->leave(rank, sequence, /*moved=*/false);  // the peers wait for this rank to finish
      throw;
    }
    group->leave(rank, sequence);
    if (trace) {
      trace->add({group->world_rank(rank), track, call.op + " #" + std::to_string(sequence), begin,
                  TraceRecorder::now_us(), static_cast<std::int64_t>(moved_bytes(call, group->world_size()))});
    }
  });
}

void LocalCommunicator::all_gather(Stream& stream, const void* send, void* recv,
                                   std::size_t count, DType dtype) {
  enqueue_collective(stream, {"all_gather", count, dtype, Reduction::kSum, 0, send, recv},
                     [](int rank, const std::vector<LocalCall>& calls) {
                       const std::size_t bytes = calls[rank].count * dtype_size(calls[rank].dtype);
                       if (bytes == 0) return;  // empty buffers may be null: no memcpy
                       char* recv = static_cast<char*>(calls[rank].recv);
                       for (std::size_t q = 0; q < calls.size(); ++q) {
                         char* destination = recv + q * bytes;
                         if (destination != calls[q].send || q != static_cast<std::size_t>(rank)) {
                           std::memcpy(destination, calls[q].send, bytes);
                         }
                       }
                     });
}

void LocalCommunicator::reduce_scatter(Stream& stream, const void* send, void* recv,
                                       std::size_t count, DType dtype, Reduction reduction) {
  enqueue_collective(stream, {"reduce_scatter", count, dtype, reduction, 0, send, recv},
                     [](int rank, const std::vector<LocalCall>& calls) {
                       const LocalCall& mine = calls[rank];
                       const std::size_t offset = rank * mine.count * dtype_size(mine.dtype);
                       std::vector<const void*> sources;
                       for (const LocalCall& call : calls) {
                         sources.push_back(byte_pointer(call.send, offset));
                       }
                       reduce_elements(sources, {mine.recv}, 0, mine.count, mine.dtype,
                                       mine.reduction);
                     });
}

void LocalCommunicator::all_reduce(Stream& stream, const void* send, void* recv,
                                   std::size_t count, DType dtype, Reduction reduction) {
  // Each rank reduces one contiguous chunk and writes it to every rank's output: the work is
  // split n ways, and no two ranks write the same element.
  enqueue_collective(stream, {"all_reduce", count, dtype, reduction, 0, send, recv},
                     [](int rank, const std::vector<LocalCall>& calls) {
                       const std::size_t world = calls.size();
                       const std::size_t count = calls[rank].count;
                       const std::size_t begin = count * rank / world;
                       const std::size_t end = count * (rank + 1) / world;
                       std::vector<const void*> sources;
                       std::vector<void*> destinations;
                       for (const LocalCall& call : calls) {
                         sources.push_back(call.send);
                         destinations.push_back(call.recv);
                       }
                       reduce_elements(sources, destinations, begin, end - begin,
                                       calls[rank].dtype, calls[rank].reduction);
                     });
}

void LocalCommunicator::broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype,
                                  int root) {
  if (root < 0 || root >= world_size()) {
    throw Error(ErrorKind::kUsage, "broadcast root " + std::to_string(root) +
                                       " is outside world size " + std::to_string(world_size()));
  }
  enqueue_collective(stream, {"broadcast", count, dtype, Reduction::kSum, root, buffer, buffer},
                     [](int rank, const std::vector<LocalCall>& calls) {
                       const LocalCall& mine = calls[rank];
                       if (rank == mine.root || mine.count == 0) return;
                       std::memcpy(mine.recv, calls[mine.root].send,
                                   mine.count * dtype_size(mine.dtype));
                     });
}

void LocalCommunicator::barrier(Stream& stream) {
  enqueue_collective(stream, {"barrier", 0, DType::kFloat32, Reduction::kSum, 0, nullptr, nullptr},
                     [](int, const std::vector<LocalCall>&) {});
}

}  // namespace zest
