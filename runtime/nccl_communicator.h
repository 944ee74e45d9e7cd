// The `nccl` backend: one GPU per rank, ranks as threads of one process (create_group) or as
// processes (create_for_process, the NCCL unique id sent by MPI). Each collective is enqueued on
// the caller's CUDA stream; a watchdog per rank aborts the NCCL communicator when a collective
// that has started does not finish within the timeout, so no rank hangs, and the error — raised
// by the stream's synchronize and by the next call — names the collective, its label and the
// timeout. Invariants: buffers are device memory on the rank's GPU; a communicator is driven by
// its rank's host thread; NCCL itself checks nothing across ranks, so ranks that issue different
// collectives hang until the timeout (the collective-order check, checked_communicator.h,
// gathers its records in host memory and does not work over NCCL yet). kMean and kPreDividedMean
// are both ncclAvg, which multiplies each input by 1/N before the sum; 2-byte types are summed in
// their own type along NCCL's ring (rounded at each step), not in fp32 as the host backends do.
// CUDA-side only: include it from *_cuda.cc sources (it does not include <nccl.h>).
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "runtime/nccl_communicator.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/communicator.h"

namespace zest {

class MpiProcess;

namespace nccl {
class GuardedComm;  // nccl_comm.h
}  // namespace nccl

class NcclCommunicator final : public Communicator {
 public:
  // `world_size` ranks as threads of this process, rank r on CUDA device r (NCCL forbids two
  // ranks on one GPU): a kConfig Error when fewer GPUs are visible. Initializes them together
  // (one ncclGroupStart/End); each is then used from its rank's thread.
  static std::vector<std::unique_ptr<NcclCommunicator>> create_group(
      int world_size, std::chrono::milliseconds timeout);
  // Destroys a group's communicators, all finalized first: finalizing waits for every rank, so
  // destroying them one by one from one thread would wait out the timeout for each.
  static void destroy_group(std::vector<std::unique_ptr<NcclCommunicator>>& group);

#if defined(ZEST_HAVE_MPI)
  // This process's rank of an MPI job, on CUDA `device`: rank 0 makes the NCCL unique id and
  // sends it to every process (MPI_COMM_WORLD); collective over the job's processes. Throws
  // kCommTimeout when the id or a peer's initialization does not come within the timeout.
  static std::unique_ptr<NcclCommunicator> create_for_process(MpiProcess& process, int device,
                                                              std::chrono::milliseconds timeout);
#endif

  // Closes the NCCL communicator (finalize, then destroy), or aborts it when it failed or a peer
  // does not finalize within the timeout. Never throws.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int world_size() const override;
  std::chrono::milliseconds timeout() const override;
  int device() const;
  // Fails this communicator with `reason` (kPeerFailure) and aborts it, from any thread: how a
  // World whose rank failed releases the peers waiting for it in a collective, at once instead
  // of at the timeout. Its later calls and its streams' checks raise `reason`.
  void abort(const std::string& reason);
  // The communicator's first failure (a watchdog's timeout, an NCCL error, an abort), from any
  // thread; nothing while it has not failed.
  std::optional<Error> failure() const;

  void all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                  DType dtype) override;
  void reduce_scatter(Stream& stream, const void* send, void* recv, std::size_t count, DType dtype,
                      Reduction reduction) override;
  void all_reduce(Stream& stream, const void* send, void* recv, std::size_t count, DType dtype,
                  Reduction reduction) override;
  void broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype, int root) override;
  // An all-reduce of one float in a scratch word of its own (NCCL has no barrier).
  void barrier(Stream& stream) override;
  // ncclSend / ncclRecv on the caller's stream. NCCL checks no sizes across ranks: a send and
  // receive of different sizes is not detected. Note: NCCL runs one communicator's operations
  // in issue order whatever their stream, so a send waits behind every earlier operation on
  // this communicator; pipelines keep activations and gradients on communicators of their own.
  void send(Stream& stream, const void* data, std::size_t count, DType dtype, int peer) override;
  void receive(Stream& stream, void* data, std::size_t count, DType dtype, int peer) override;
  // ncclCommSplit, after an all-gather of every rank's color and key (on a stream of its own,
  // synchronized; the watchdog bounds it), which gives the group its members' world ranks.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      std::chrono::milliseconds timeout = {}) override;
  std::string group_name() const override { return group_name_; }
  int world_rank_of(int rank) const override;
  void label_next(const char* label) override;
  void name_next(const std::string& caller) override { name_ = caller; }
  void begin_step(std::int64_t step) override { step_ = step; }

  // Internal: use the factories. Takes `comm`, initialized.
  explicit NcclCommunicator(std::unique_ptr<nccl::GuardedComm> comm);

 private:
  // "all_gather of 4096 bf16 elements ('gather block3') at step 2", consuming the label; the
  // caller's name instead when a wrapper gave one (name_next).
  std::string describe(const char* op, std::size_t count, DType dtype);
  // Enqueues a check after a collective, so the stream fails with the communicator.
  void enqueue_check(Stream& stream);
  // Checks `peer` for a transfer: a rank of the group, not this one.
  void check_peer(int peer, const char* op) const;
  // " in the <group name>", or "".
  std::string in_group() const;

  std::unique_ptr<nccl::GuardedComm> comm_;
  float* barrier_word_ = nullptr;  // device memory (cudaMalloc, made with the communicator)
  std::string label_;              // for the next collective
  std::string name_;               // for the next collective: the caller's (name_next)
  std::int64_t step_ = 0;
  std::string group_name_;        // empty: the world
  std::vector<int> world_ranks_;  // each rank's in the world; empty: the world
  std::vector<std::uint64_t> next_send_, next_receive_;  // per peer, for errors
};

}  // namespace zest
