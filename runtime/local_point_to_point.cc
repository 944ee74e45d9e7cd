// The `local` backend's point-to-point transfers and group splits (local_communicator.h).
#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "base/error.h"
#include "runtime/device_mesh.h"
#include "runtime/local_communicator.h"

namespace zest {

// ---- point to point --------------------------------------------------------------------------

std::cv_status LocalGroup::wait_for_peer(std::unique_lock<std::mutex>& lock, int rank, int peer,
                                         std::chrono::steady_clock::time_point deadline) {
  const WaitBoard::Posted posted(board_.get(), world_rank(rank), {world_rank(peer)});
  return changed_.wait_until(lock, deadline);
}

std::string LocalGroup::stalled_peer_text(int rank, int peer, std::string_view otherwise) const {
  const std::string chain = chain_text(board_.get(), world_rank(rank), {world_rank(peer)});
  if (!chain.empty()) return chain + ", stalled";
  return fmt::format("rank {} is stalled or {}", world_rank(peer), otherwise);
}

void LocalGroup::send(int from, int to, std::uint64_t sequence, const LocalCall& call) {
  std::unique_lock lock(mutex_);
  const auto key = std::make_tuple(from, to, sequence);
  Transfer& transfer = transfers_[key];
  const auto describe = [&](std::string_view waited) {
    return describe_transfer("send", sequence, call.count, call.dtype, world_rank(from),
                             world_rank(to), call.label, waited) +
           at_step(call.step) + in_group();
  };
  // Note: a side that gives up marks the transfer withdrawn while holding the lock; the other
  // side then erases it and fails. Once the receiver has claimed the data it is copying from
  // this rank's buffer, and this rank waits for it whatever else fails, as a collective's leave().
  const auto give_up = [&](ErrorKind kind, const std::string& message) {
    transfer.withdrawn = true;
    lock.unlock();
    poison(from, kind, message);
    throw Error(kind, message);
  };
  if (transfer.withdrawn) {
    transfers_.erase(key);
    throw Error(ErrorKind::kPeerFailure, describe({}) + ": " + poison_reason_);
  }
  transfer.send = call;
  transfer.sent = true;
  changed_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    if (transfer.taken || !transfer.mismatch.empty()) break;
    if (transfer.claimed) {
      changed_.wait(lock);
      continue;
    }
    if (poisoned_) {
      transfer.withdrawn = true;
      throw Error(ErrorKind::kPeerFailure, describe({}) + ": " + poison_reason_);
    }
    if (rank_departed_[to]) {
      give_up(ErrorKind::kCommMismatch,
              describe({}) + ": rank " + std::to_string(world_rank(to)) +
                  " finished without receiving it; every send needs its receive");
    }
    if (wait_for_peer(lock, from, to, deadline) == std::cv_status::timeout &&
        !transfer.claimed && !transfer.taken && transfer.mismatch.empty() && !poisoned_) {
      give_up(ErrorKind::kCommTimeout,
              describe(seconds_text(timeout_)) + "; " +
                  stalled_peer_text(from, to, "never receives it") +
                  " (world.timeout_s sets the limit)");
    }
  }
  const std::string mismatch = transfer.mismatch;
  transfers_.erase(key);
  if (!mismatch.empty()) throw Error(ErrorKind::kCommMismatch, mismatch);
}

void LocalGroup::receive(int from, int to, std::uint64_t sequence, const LocalCall& call) {
  std::unique_lock lock(mutex_);
  const auto key = std::make_tuple(from, to, sequence);
  Transfer& transfer = transfers_[key];
  const auto describe = [&](std::string_view waited) {
    return describe_transfer("receive", sequence, call.count, call.dtype, world_rank(to),
                             world_rank(from), call.label, waited) +
           at_step(call.step) + in_group();
  };
  const auto give_up = [&](ErrorKind kind, const std::string& message) {
    transfer.withdrawn = true;
    lock.unlock();
    poison(to, kind, message);
    throw Error(kind, message);
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    if (transfer.withdrawn) {
      transfers_.erase(key);
      throw Error(ErrorKind::kPeerFailure, describe({}) + ": " + poison_reason_);
    }
    if (transfer.sent) break;
    if (poisoned_) {
      transfer.withdrawn = true;
      throw Error(ErrorKind::kPeerFailure, describe({}) + ": " + poison_reason_);
    }
    if (rank_departed_[from]) {
      give_up(ErrorKind::kCommMismatch,
              describe({}) + ": rank " + std::to_string(world_rank(from)) +
                  " finished without sending it; every receive needs its send");
    }
    if (wait_for_peer(lock, to, from, deadline) == std::cv_status::timeout && !transfer.sent &&
        !transfer.withdrawn && !poisoned_) {
      give_up(ErrorKind::kCommTimeout,
              describe(seconds_text(timeout_)) + "; " +
                  stalled_peer_text(to, from, "never sends it") +
                  " (world.timeout_s sets the limit)");
    }
  }
  const LocalCall& sent = transfer.send;
  if (sent.count != call.count || sent.dtype != call.dtype) {
    const std::string message = fmt::format(
        "point-to-point mismatch{}: rank {} sent {} x {}{} (send #{}) but rank {} receives {} x "
        "{}{} (receive #{}); every send must pair with a receive of the same count and dtype",
        in_group(), world_rank(from), sent.count, dtype_name(sent.dtype),
        sent.label.empty() ? "" : " '" + sent.label + "'", sequence, world_rank(to), call.count,
        dtype_name(call.dtype), call.label.empty() ? "" : " '" + call.label + "'", sequence);
    transfer.mismatch = message;  // the sender erases the transfer
    lock.unlock();
    changed_.notify_all();
    poison(to, ErrorKind::kCommMismatch, message);
    throw Error(ErrorKind::kCommMismatch, message);
  }
  transfer.claimed = true;
  const void* source = sent.send;
  lock.unlock();
  const std::size_t bytes = call.count * dtype_size(call.dtype);
  if (bytes > 0) std::memcpy(call.recv, source, bytes);
  lock.lock();
  transfer.taken = true;  // the sender erases the transfer
  lock.unlock();
  changed_.notify_all();
}

// ---- splits ----------------------------------------------------------------------------------

LocalGroup::Membership LocalGroup::split(int rank, std::uint64_t sequence, int color, int key,
                                         const std::string& name,
                                         std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  Splitting& split = splits_[sequence];
  if (split.arrived.empty()) {
    const auto n = static_cast<std::size_t>(world_size_);
    split.colors.assign(n, -1);
    split.keys.assign(n, 0);
    split.names.assign(n, {});
    split.timeouts.assign(n, {});
    split.arrived.assign(n, false);
    split.result.assign(n, {});
  }
  split.colors[rank] = color;
  split.keys[rank] = key;
  split.names[rank] = name;
  split.timeouts[rank] = timeout;
  split.arrived[rank] = true;
  ++split.arrived_count;
  changed_.notify_all();
  const std::string where = fmt::format("split #{} ('{}') on rank {}{}", sequence, name,
                                        world_rank(rank), in_group());
  const auto give_up = [&](ErrorKind kind, const std::string& message) {
    lock.unlock();
    poison(rank, kind, message);
    throw Error(kind, message);
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!split.done) {
    if (poisoned_) throw Error(ErrorKind::kPeerFailure, where + ": " + poison_reason_);
    if (split.arrived_count == world_size_) {
      // The last to arrive makes every group: members by key, then by rank here.
      for (int first = 0; first < world_size_; ++first) {
        const int group_color = split.colors[first];
        if (group_color < 0 || split.result[first].group) continue;
        std::vector<int> members;
        for (int r = 0; r < world_size_; ++r) {
          if (split.colors[r] == group_color) members.push_back(r);
        }
        std::stable_sort(members.begin(), members.end(),
                         [&](int a, int b) { return split.keys[a] < split.keys[b]; });
        std::vector<int> world;
        for (int r : members) world.push_back(world_rank(r));
        const auto group_timeout =
            split.timeouts[first].count() > 0 ? split.timeouts[first] : timeout_;
        auto group = std::make_shared<LocalGroup>(static_cast<int>(members.size()), group_timeout,
                                                  split.names[first], std::move(world), board_);
        children_.push_back(group);
        for (std::size_t i = 0; i < members.size(); ++i) {
          split.result[members[i]] = {group, static_cast<int>(i)};
        }
      }
      split.done = true;
      changed_.notify_all();
      break;
    }
    std::vector<int> missing, departed;
    for (int r = 0; r < world_size_; ++r) {
      if (split.arrived[r]) continue;
      missing.push_back(world_rank(r));
      if (rank_departed_[r]) departed.push_back(world_rank(r));
    }
    if (!departed.empty()) {
      give_up(ErrorKind::kCommMismatch, where + ": rank(s) " + rank_list_text(departed) +
                                            " finished without calling it; every rank must "
                                            "split the same groups in the same order");
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !split.done &&
        !poisoned_) {
      give_up(ErrorKind::kCommTimeout, where + ": timed out after " + seconds_text(timeout_) +
                                           " waiting for rank(s) " + rank_list_text(missing) +
                                           " (world.timeout_s sets the limit)");
    }
  }
  Membership membership = split.result[rank];
  if (++split.taken_count == world_size_) splits_.erase(sequence);
  return membership;
}

// ---- the communicator's side -----------------------------------------------------------------

void LocalCommunicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= world_size()) {
    throw Error(ErrorKind::kUsage, fmt::format("{} to rank {}: outside a group of {} ranks{}", op,
                                               peer, world_size(),
                                               group_->name().empty() ? "" : " (" + group_->name() + ")"));
  }
  if (peer == rank_) {
    throw Error(ErrorKind::kUsage,
                fmt::format("{} on rank {}: a rank cannot send to or receive from itself", op,
                            group_->world_rank(rank_)));
  }
}

void LocalCommunicator::send(Stream& stream, const void* data, std::size_t count, DType dtype,
                             int peer) {
  check_peer(peer, "send");
  const std::uint64_t sequence = next_send_[static_cast<std::size_t>(peer)]++;
  LocalCall call{"send", count, dtype, Reduction::kSum, peer, data, nullptr};
  call.label = std::exchange(label_, {});
  call.step = step_;
  name_.clear();
  const std::string track = stream_role(stream.name());
  stream.enqueue([group = group_, rank = rank_, peer, sequence, call = std::move(call),
                  trace = trace_, track] {
    const std::int64_t begin = trace ? TraceRecorder::now_us() : 0;
    group->send(rank, peer, sequence, call);
    if (trace) {
      trace->add({group->world_rank(rank), track,
                  fmt::format("send #{} to rank {}", sequence, group->world_rank(peer)), begin,
                  TraceRecorder::now_us(),
                  static_cast<std::int64_t>(call.count * dtype_size(call.dtype))});
    }
  });
}

void LocalCommunicator::receive(Stream& stream, void* data, std::size_t count, DType dtype,
                                int peer) {
  check_peer(peer, "receive");
  const std::uint64_t sequence = next_receive_[static_cast<std::size_t>(peer)]++;
  LocalCall call{"receive", count, dtype, Reduction::kSum, peer, nullptr, data};
  call.label = std::exchange(label_, {});
  call.step = step_;
  name_.clear();
  const std::string track = stream_role(stream.name());
  stream.enqueue([group = group_, rank = rank_, peer, sequence, call = std::move(call),
                  trace = trace_, track] {
    const std::int64_t begin = trace ? TraceRecorder::now_us() : 0;
    group->receive(peer, rank, sequence, call);
    if (trace) {
      trace->add({group->world_rank(rank), track,
                  fmt::format("receive #{} from rank {}", sequence, group->world_rank(peer)),
                  begin, TraceRecorder::now_us(),
                  static_cast<std::int64_t>(call.count * dtype_size(call.dtype))});
    }
  });
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int key,
                                                       const std::string& name,
                                                       std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) throw Error(ErrorKind::kUsage, "split: the timeout must be >= 0");
  const LocalGroup::Membership membership =
      group_->split(rank_, next_split_++, color, key, name, timeout);
  if (!membership.group) return nullptr;
  auto communicator = std::make_unique<LocalCommunicator>(membership.group, membership.rank);
  communicator->set_delay(delay_);
  communicator->set_trace(trace_);
  return communicator;
}

}  // namespace zest
