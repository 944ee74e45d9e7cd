// The `mpi` backend: ranks are processes, on one machine or many, and collectives are MPI's
// nonblocking ones (MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Iallreduce, MPI_Ibcast,
// MPI_Ibarrier) on communicators duplicated from MPI_COMM_WORLD. Each call enqueues on the
// caller's stream a closure that starts the operation and polls it until it completes or the
// timeout passes. Collectives pair across ranks by the order this rank issued them (host
// order), whatever stream runs them, as in the local backend, and every rank checks that its
// peers called the same collective (op, count, dtype, reduction, root) before it starts.
// Groups (split) are MPI_Comm_split of a communicator kept for splits alone, after an
// MPI_Iallgather of every rank's color polled against the timeout, so a rank that never joins
// is a timeout, not a hang (MPI has no nonblocking split: a peer that dies between the two
// calls is left to the launcher, which ends the job). Point to point is MPI_Isend / MPI_Irecv
// of bytes on a communicator of its own, the tag the pair's running count, so transfers pair in
// each rank's issue order whatever stream starts them; the receiver checks the byte count.
// Invariant: after a failure — a timeout, a mismatch, an MPI error — the communicator is broken
// and every later collective fails at once; MPI cannot cancel a collective that a peer never
// joined, so the caller must end the job (World does, with MPI_Abort). Built only with MPI.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/communicator.h"

namespace zest {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates MPI_COMM_WORLD (collective: every process calls it), initializing MPI for this
  // process first if nothing has (MpiProcess). Throws kUsage for a timeout <= 0.
  explicit MpiCommunicator(std::chrono::milliseconds timeout);
  // Frees the duplicated communicator once the last enqueued collective has run. Destroy before
  // the process exits (MPI is finalized then).
  ~MpiCommunicator() override;

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

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
  std::string group_name() const override;
  int world_rank_of(int rank) const override;
  void label_next(const char* label) override { label_ = label == nullptr ? "" : label; }
  void name_next(const std::string& caller) override { name_ = caller; }
  void begin_step(std::int64_t step) override { step_ = step; }

  // The communicator's first failure (a timeout, a mismatch, an MPI error), from any thread:
  // the cause that the echoes of it (a stream that waited on the failed one, a collective that
  // failed because the communicator had) only repeat. Nothing while it has not failed.
  std::optional<Error> failure() const;

  // The state every enqueued collective shares (the duplicated communicator, the issue order);
  // defined in the .cc, where <mpi.h> may be included.
  struct Shared;
  // A group's communicator over `shared` (split).
  explicit MpiCommunicator(std::shared_ptr<Shared> shared);

 private:
  // Checks `peer` for a transfer: a rank of the group, not this one.
  void check_peer(int peer, const char* op) const;

  std::shared_ptr<Shared> shared_;
  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::uint64_t next_sequence_ = 0;
  std::vector<std::uint64_t> next_send_;     // per peer
  std::vector<std::uint64_t> next_receive_;  // per peer
  std::string label_;  // for the next collective
  std::string name_;   // for the next collective: the caller's, when a wrapper issues it
  std::int64_t step_ = 0;
};

}  // namespace zest
