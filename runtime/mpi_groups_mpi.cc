// The `mpi` backend's groups (MPI_Comm_split) and point-to-point transfers (mpi_communicator.h).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "runtime/mpi_check.h"
#include "runtime/mpi_communicator.h"
#include "runtime/mpi_shared_mpi.h"

namespace zest {

using namespace mpi_detail;

// ---- groups ----------------------------------------------------------------------------------

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name,
                                                     std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) throw Error(ErrorKind::kUsage, "split: the timeout must be >= 0");
  Shared& shared = *shared_;
  Call call{Op::kAllGather, shared.next_split++, 2, DType::kInt32};
  call.name = "split #" + std::to_string(call.sequence) + " ('" + name + "')";
  {
    std::lock_guard lock(shared.mutex);
    if (!shared.broken.empty()) {
      throw Error(ErrorKind::kPeerFailure,
                  shared.where(call) + ": not started, the communicator failed earlier: " +
                      shared.broken);
    }
  }
  // Note: the all-gather proves every rank has arrived, within the timeout, before the blocking
  // MPI_Comm_split; it also gives every rank the members' world ranks, for the group's errors.
  auto scratch = std::make_shared<Scratch>();
  scratch->signature[0] = static_cast<std::uint64_t>(static_cast<std::int64_t>(color < 0 ? -1 : color));
  scratch->signature[1] = static_cast<std::uint64_t>(static_cast<std::int64_t>(key));
  scratch->signatures.assign(static_cast<std::size_t>(shared.world_size) * 2, 0);
  MPI_Request request = MPI_REQUEST_NULL;
  const int code = MPI_Iallgather(scratch->signature.data(), 2, MPI_UINT64_T,
                                  scratch->signatures.data(), 2, MPI_UINT64_T, shared.control,
                                  &request);
  if (code != MPI_SUCCESS) shared.fail(call, "MPI_Iallgather (split)", code);
  shared.complete(request, call, "MPI_Test (split)", scratch,
                  shared.where(call) + ": timed out after " + shared.timeout_text() +
                      " waiting for the other ranks to call it; a rank is stalled, failed or "
                      "splits different groups (world.timeout_s sets the limit)");
  MPI_Comm comm = MPI_COMM_NULL;
  ZEST_MPI_CHECK(MPI_Comm_split(shared.control, color < 0 ? MPI_UNDEFINED : color, key, &comm));
  if (comm == MPI_COMM_NULL) return nullptr;
  const auto color_of = [&](int r) {
    return static_cast<std::int64_t>(scratch->signatures[static_cast<std::size_t>(r) * 2]);
  };
  const auto key_of = [&](int r) {
    return static_cast<std::int64_t>(scratch->signatures[static_cast<std::size_t>(r) * 2 + 1]);
  };
  std::vector<int> members;
  for (int r = 0; r < shared.world_size; ++r) {
    if (color_of(r) == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return key_of(a) < key_of(b); });
  std::vector<int> world;
  for (int r : members) world.push_back(shared.world_rank(r));
  std::shared_ptr<Shared> group;
  try {
    group = make_shared_state(comm, timeout.count() > 0 ? timeout : shared.timeout, name,
                              std::move(world));
  } catch (...) {
    MPI_Comm_free(&comm);
    throw;
  }
  MPI_Comm_free(&comm);
  return std::make_unique<MpiCommunicator>(std::move(group));
}

// ---- point to point --------------------------------------------------------------------------

namespace {

// Transfers between a pair of ranks are tagged with their running count modulo this (MPI
// guarantees tags up to 32767): a receive matches its send whatever order streams post them.
constexpr std::uint64_t kTransferTags = 32768;

}  // namespace

void MpiCommunicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= world_size_) {
    throw Error(ErrorKind::kUsage, std::string(op) + " to rank " + std::to_string(peer) +
                                       ": outside a group of " + std::to_string(world_size_) +
                                       " ranks" + shared_->in_group());
  }
  if (peer == rank_) {
    throw Error(ErrorKind::kUsage, std::string(op) + " on rank " +
                                       std::to_string(shared_->world_rank(rank_)) +
                                       ": a rank cannot send to or receive from itself");
  }
}

void MpiCommunicator::send(Stream& stream, const void* data, std::size_t count, DType dtype,
                           int peer) {
  check_peer(peer, "send");
  const std::uint64_t sequence = next_send_[static_cast<std::size_t>(peer)]++;
  const int bytes = checked_count(count * dtype_size(dtype), "send (bytes)");
  Call call{Op::kBarrier, sequence, count, dtype};
  const std::string label = std::exchange(label_, {});
  call.name = describe_collective("send", sequence, count, dtype, Reduction::kSum, 0, label) +
              " to rank " + std::to_string(shared_->world_rank(peer));
  call.step = step_;
  name_.clear();
  const std::string timeout_message =
      describe_transfer("send", sequence, count, dtype, shared_->world_rank(rank_),
                        shared_->world_rank(peer), label, shared_->timeout_text()) +
      at_step(step_) + shared_->in_group() + "; rank " +
      std::to_string(shared_->world_rank(peer)) +
      " is stalled or never receives it (world.timeout_s sets the limit)";
  stream.enqueue([shared = shared_, data, bytes, peer, call, timeout_message] {
    {
      std::lock_guard lock(shared->mutex);
      if (!shared->broken.empty()) {
        throw Error(ErrorKind::kPeerFailure, shared->where(call) +
                                                 ": not started, the communicator failed "
                                                 "earlier: " + shared->broken);
      }
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const int code = MPI_Isend(data, bytes, MPI_BYTE, peer,
                               static_cast<int>(call.sequence % kTransferTags),
                               shared->transfers, &request);
    if (code != MPI_SUCCESS) shared->fail(call, "MPI_Isend", code);
    shared->complete(request, call, "MPI_Test (send)", std::make_shared<Scratch>(),
                     timeout_message);
  });
}

void MpiCommunicator::receive(Stream& stream, void* data, std::size_t count, DType dtype,
                              int peer) {
  check_peer(peer, "receive");
  const std::uint64_t sequence = next_receive_[static_cast<std::size_t>(peer)]++;
  const int bytes = checked_count(count * dtype_size(dtype), "receive (bytes)");
  Call call{Op::kBarrier, sequence, count, dtype};
  const std::string label = std::exchange(label_, {});
  call.name = describe_collective("receive", sequence, count, dtype, Reduction::kSum, 0, label) +
              " from rank " + std::to_string(shared_->world_rank(peer));
  call.step = step_;
  name_.clear();
  const std::string waited =
      describe_transfer("receive", sequence, count, dtype, shared_->world_rank(rank_),
                        shared_->world_rank(peer), label, shared_->timeout_text()) +
      at_step(step_) + shared_->in_group() + "; rank " +
      std::to_string(shared_->world_rank(peer)) +
      " is stalled or never sends it (world.timeout_s sets the limit)";
  stream.enqueue([shared = shared_, data, bytes, peer, call, waited] {
    // Note: a matched probe first, so that a send of another size is a mismatch naming both
    // sizes before anything is written, where MPI_Irecv would truncate or leave bytes unwritten.
    const int tag = static_cast<int>(call.sequence % kTransferTags);
    const auto deadline = Clock::now() + shared->timeout;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    for (;;) {
      {
        std::lock_guard lock(shared->mutex);
        if (!shared->broken.empty()) {
          throw Error(ErrorKind::kPeerFailure,
                      shared->where(call) + ": the communicator failed: " + shared->broken);
        }
      }
      int found = 0;
      const int code = MPI_Improbe(peer, tag, shared->transfers, &found, &message, &status);
      if (code != MPI_SUCCESS) shared->fail(call, "MPI_Improbe", code);
      if (found) break;
      if (Clock::now() >= deadline) {
        shared->break_with(ErrorKind::kCommTimeout, waited);
        throw Error(ErrorKind::kCommTimeout, waited);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    int sent = 0;
    ZEST_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &sent));
    if (sent != bytes) {
      const std::string mismatch =
          "point-to-point mismatch" + shared->in_group() + ": rank " +
          std::to_string(shared->world_rank(peer)) + " sent " + std::to_string(sent) +
          " bytes (send #" + std::to_string(call.sequence) + ") but rank " +
          std::to_string(shared->world_rank(shared->rank)) + " receives " +
          std::to_string(bytes) + " (" + call.name +
          "); every send must pair with a receive of the same count and dtype";
      // The probed message is this receive's to take: taken into scratch, it leaves nothing
      // matched and pending in MPI.
      std::vector<char> discard(static_cast<std::size_t>(std::max(sent, 1)));
      (void)MPI_Mrecv(discard.data(), sent, MPI_BYTE, &message, MPI_STATUS_IGNORE);
      shared->break_with(ErrorKind::kCommMismatch, mismatch);
      throw Error(ErrorKind::kCommMismatch, mismatch);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    const int code = MPI_Imrecv(data, bytes, MPI_BYTE, &message, &request);
    if (code != MPI_SUCCESS) shared->fail(call, "MPI_Imrecv", code);
    shared->complete(request, call, "MPI_Test (receive)", std::make_shared<Scratch>(), waited);
  });
}

}  // namespace zest
