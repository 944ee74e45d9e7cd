// One rank's NCCL communicator with its watchdog: the ncclComm_t (nonblocking), the collectives
// this rank has enqueued and not yet seen finish, and a thread that polls them. A collective
// that started on its stream and has not finished within the timeout, or an asynchronous NCCL
// error, makes the watchdog record a failure naming the collective and abort the communicator
// (ncclCommAbort), so that its kernels exit and no rank waits forever; every later call, and
// the check enqueued after each collective (so the stream's synchronize), raises that failure.
// Invariant: one host thread issues on it (its rank's); the watchdog only queries and aborts,
// and every use of the handle happens under one mutex, so none follows the abort.
// Internal to the NCCL backend (includes <nccl.h>): only *_cuda.cc files include it.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"

namespace zest::nccl {

// Makes `device` the calling thread's current device for a scope and restores the previous one:
// a communicator may be made, used or destroyed from a thread whose current device is another.
class DeviceScope {
 public:
  explicit DeviceScope(int device);  // throws (ZEST_CUDA_CHECK) if cudaSetDevice fails
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// The config of every zest communicator: nonblocking, so that no NCCL call blocks the host thread
// (it returns ncclInProgress and NCCL completes it in the background).
ncclConfig_t nonblocking_config();

// A communicator's first failure, shared with the checks enqueued on streams (host functions,
// which must not touch the communicator itself).
class Failure {
 public:
  void set(ErrorKind kind, const std::string& message);  // keeps the first
  bool failed() const;
  std::optional<Error> get() const;  // the failure, if any
  void throw_if_failed() const;  // throws the failure as an Error of its kind

 private:
  mutable std::mutex mutex_;
  std::optional<Error> error_;
};

class GuardedComm {
 public:
  // Takes `comm`, whose initialization was started (nonblocking) on `device`, and waits until it
  // is ready; past `timeout` (a rank never joined) aborts it and throws kCommTimeout. A rank
  // or size < 0 (a split's group) is asked of NCCL once ready. `where` names this rank in
  // errors ("rank 2 in the pipeline group ..."); empty: "rank <rank>".
  GuardedComm(ncclComm_t comm, int rank, int world_size, int device,
              std::chrono::milliseconds timeout, std::string where = {});
  // Stops the watchdog; then closes the communicator (finalize, then destroy) or, when it failed
  // or closing takes past the timeout, aborts it. Never throws.
  ~GuardedComm();
  GuardedComm(const GuardedComm&) = delete;
  GuardedComm& operator=(const GuardedComm&) = delete;

  // Enqueues one collective on `stream`: `calls` makes its NCCL calls (one or several: they are
  // batched between ncclGroupStart and ncclGroupEnd), each checked with ZEST_NCCL_CHECK.
  // `what` names the collective in errors ("all_gather of 4096 bf16 elements"). Throws the
  // communicator's failure if it has failed, and fails it (naming `what`) if NCCL does not
  // accept the calls within the timeout.
  void issue(const std::string& what, cudaStream_t stream,
             const std::function<void(ncclComm_t)>& calls);

  // ncclCommSplit of this communicator (collective over its ranks, from each rank's thread):
  // the group of `color` (none, null, when it is negative), ranked by `key`, its own timeout
  // `timeout`, named in errors by `where`. Fails this communicator, like any call, when NCCL does
  // not finish within the timeout.
  std::unique_ptr<GuardedComm> split(int color, int key, std::chrono::milliseconds timeout,
                                     const std::string& where);

  // Starts the collective part of closing (ncclCommFinalize), so that the ranks of one process
  // closed one after another from one thread do not wait for each other in turn. Idempotent.
  void begin_close();
  // Fails the communicator with `reason` (kPeerFailure) and aborts it: for the ranks of a group
  // whose initialization failed elsewhere, which would otherwise wait out the timeout.
  void abort(const std::string& reason);

  const std::shared_ptr<Failure>& failure() const { return failure_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct InFlight {
    std::string what;
    cudaEvent_t start = nullptr;  // recorded before the NCCL calls: has the stream reached them?
    cudaEvent_t end = nullptr;    // recorded after them
    std::optional<std::chrono::steady_clock::time_point> started;  // first seen reached
  };

  // Polls the communicator's state until it leaves ncclInProgress; past the deadline fails it
  // with `what`. Unlocks between polls so the watchdog can act. Throws on failure.
  void wait_ready(std::unique_lock<std::mutex>& lock, const std::string& what);
  // Records the failure and aborts the communicator. Called with mutex_ held.
  void fail(ErrorKind kind, const std::string& message);
  void watch();
  // One pass of the watchdog over the communicator and the collectives in flight.
  void poll();
  cudaEvent_t take_event();
  std::string timeout_text() const;

  int rank_;        // set once, before the watchdog starts
  int world_size_;  // set once, before the watchdog starts
  std::string where_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<Failure> failure_ = std::make_shared<Failure>();

  std::mutex mutex_;
  std::condition_variable stop_changed_;
  ncclComm_t comm_ = nullptr;  // null once aborted or destroyed
  bool finalizing_ = false;
  bool stop_ = false;
  std::list<InFlight> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
  std::thread watchdog_;
};

// "2.5 s", "30 s": a timeout as the errors show it.
std::string seconds_text(std::chrono::milliseconds duration);

}  // namespace zest::nccl
