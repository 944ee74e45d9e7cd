#include "runtime/nccl_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "base/cuda_check.h"
#include "runtime/nccl_check.h"
#include "runtime/thread_start.h"

namespace zest::nccl {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

DeviceScope::DeviceScope(int device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != device) ZEST_CUDA_CHECK(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

std::string seconds_text(std::chrono::milliseconds duration) {
  return fmt::format("{:g} s", static_cast<double>(duration.count()) / 1000.0);
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// ---- Failure ---------------------------------------------------------------------------------

void Failure::set(ErrorKind kind, const std::string& message) {
  std::lock_guard lock(mutex_);
  if (!error_) error_.emplace(kind, message);  // the first failure is the cause
}

bool Failure::failed() const {
  std::lock_guard lock(mutex_);
  return error_.has_value();
}

std::optional<Error> Failure::get() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void Failure::throw_if_failed() const {
  if (const std::optional<Error> error = get()) raise(*error);
}

// ---- GuardedComm -----------------------------------------------------------------------------

GuardedComm::GuardedComm(ncclComm_t comm, int rank, int world_size, int device,
                         std::chrono::milliseconds timeout, std::string where)
    : rank_(rank),
      world_size_(world_size),
      where_(where.empty() ? "rank " + std::to_string(rank) : std::move(where)),
      device_(device),
      timeout_(timeout),
      comm_(comm) {
  {
    std::unique_lock lock(mutex_);
    wait_ready(lock, world_size < 0 ? std::string("NCCL initialization of a split group")
                                    : "NCCL initialization (" + std::to_string(world_size) +
                                          " ranks)");
    if (rank_ < 0 || world_size_ < 0) {
      // Note: a split's child learns its place from NCCL; asked before the watchdog starts, so
      // nothing reads the two while they change.
      try {
        DeviceScope scope(device_);
        ZEST_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
        ZEST_NCCL_CHECK(ncclCommCount(comm_, &world_size_));
      } catch (...) {
        (void)ncclCommAbort(comm_);  // the destructor will not run
        comm_ = nullptr;
        throw;
      }
    }
  }
  try {
    watchdog_ = start_thread("the NCCL watchdog of rank " + std::to_string(rank),
                             [this] { watch(); });
  } catch (...) {
    // The destructor will not run: abort here, or the communicator's peers would wait on it.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    throw;
  }
}

GuardedComm::~GuardedComm() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  stop_changed_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  begin_close();
  std::lock_guard lock(mutex_);
  try {
    DeviceScope scope(device_);
    if (comm_ != nullptr) {
      // Finalizing waits for every peer to finalize too: bounded, since a peer that failed
      // never will. Past the timeout the communicator is aborted, which needs no peer.
      const auto deadline = Clock::now() + timeout_;
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (state == ncclSuccess) {
        (void)ncclCommDestroy(comm_);
      } else {
        (void)ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    for (const InFlight& entry : in_flight_) {
      spare_events_.push_back(entry.start);
      spare_events_.push_back(entry.end);
    }
    // Note: an event still pending on a stream may be destroyed: CUDA frees it once it completes.
    for (cudaEvent_t event : spare_events_) (void)cudaEventDestroy(event);
    (void)cudaGetLastError();
  } catch (const Error&) {
    // cudaSetDevice failed: the device is gone, and with it what there was to free.
  }
}

std::unique_ptr<GuardedComm> GuardedComm::split(int color, int key,
                                                std::chrono::milliseconds timeout,
                                                const std::string& where) {
  ncclComm_t child = nullptr;
  {
    std::unique_lock lock(mutex_);
    failure_->throw_if_failed();
    if (comm_ == nullptr || finalizing_) {
      throw Error(ErrorKind::kUsage, "ncclCommSplit on " + where_ + ": the NCCL communicator is closing");
    }
    DeviceScope scope(device_);
    ncclConfig_t config = nonblocking_config();
    const ncclResult_t status =
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    if (status != ncclInProgress) ZEST_NCCL_CHECK(status);
    // The parent takes part in the split: bounded by its timeout, like every call on it.
    wait_ready(lock, "ncclCommSplit (color " + std::to_string(color) + ")");
  }
  if (color < 0 || child == nullptr) return nullptr;
  return std::make_unique<GuardedComm>(child, -1, -1, device_, timeout, where);
}

void GuardedComm::begin_close() {
  std::lock_guard lock(mutex_);
  if (comm_ == nullptr || finalizing_) return;
  finalizing_ = true;
  const ncclResult_t status = ncclCommFinalize(comm_);
  if (status != ncclSuccess && status != ncclInProgress) {
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

void GuardedComm::abort(const std::string& reason) {
  std::lock_guard lock(mutex_);
  fail(ErrorKind::kPeerFailure, reason);
}

void GuardedComm::fail(ErrorKind kind, const std::string& message) {
  failure_->set(kind, message);
  if (comm_ == nullptr) return;
  // Note: abort, not destroy: it makes the kernels of this communicator that wait for a peer
  // exit, and needs no peer, so the streams behind them drain and nobody hangs.
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
}

std::string GuardedComm::timeout_text() const { return seconds_text(timeout_); }

void GuardedComm::wait_ready(std::unique_lock<std::mutex>& lock, const std::string& what) {
  const auto deadline = Clock::now() + timeout_;
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    if (comm_ == nullptr) break;  // aborted meanwhile (by the watchdog)
    ncclResult_t state = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
    if (status != ncclSuccess) state = status;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail(error_kind(state), what + " on " + where_ + " failed: " +
                                  status_text(state, comm_) + "; aborted the NCCL communicator");
      break;
    }
    if (Clock::now() >= deadline) {
      fail(ErrorKind::kCommTimeout,
           what + " on " + where_ + " was not set up by NCCL within " +
               timeout_text() +
               ": aborted the NCCL communicator; a peer rank may have died or not joined "
               "(world.timeout_s sets the limit)");
      break;
    }
    // Note: unlocked while it sleeps, so the watchdog may poll (and abort) meanwhile.
    lock.unlock();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
    lock.lock();
  }
  failure_->throw_if_failed();
  throw Error(ErrorKind::kInternal, "the NCCL communicator was closed during " + what);
}

cudaEvent_t GuardedComm::take_event() {
  if (!spare_events_.empty()) {
    cudaEvent_t event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  cudaEvent_t event = nullptr;
  ZEST_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void GuardedComm::issue(const std::string& what, cudaStream_t stream,
                        const std::function<void(ncclComm_t)>& calls) {
  std::unique_lock lock(mutex_);
  failure_->throw_if_failed();
  if (comm_ == nullptr || finalizing_) {
    throw Error(ErrorKind::kUsage,
                what + " on " + where_ + ": the NCCL communicator is closing");
  }
  DeviceScope scope(device_);
  InFlight entry{what, take_event(), take_event(), std::nullopt};
  try {
    ZEST_CUDA_CHECK(cudaEventRecord(entry.start, stream));
    ZEST_NCCL_CHECK(ncclGroupStart());
    try {
      calls(comm_);
    } catch (...) {
      (void)ncclGroupEnd();  // the group must be closed whatever failed inside it
      throw;
    }
    ZEST_NCCL_CHECK(ncclGroupEnd());
    // Note: a nonblocking communicator may launch the kernels only once its state leaves
    // ncclInProgress; the end event must be recorded after them.
    wait_ready(lock, what);
    ZEST_CUDA_CHECK(cudaEventRecord(entry.end, stream));
  } catch (const std::exception& error) {
    spare_events_.push_back(entry.start);
    spare_events_.push_back(entry.end);
    if (failure_->failed()) throw;  // already names the collective
    raise(with_context(error, what + " on " + where_));
  }
  in_flight_.push_back(std::move(entry));
}

void GuardedComm::watch() {
  (void)cudaSetDevice(device_);  // for the event queries; a failure shows in them
  // Note: a twentieth of the timeout (1 ms to 100 ms): a timeout is noticed within 5% of it,
  // and a long one costs a few queries a second.
  const auto interval =
      std::clamp(timeout_ / 20, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
  std::unique_lock lock(mutex_);
  while (!stop_) {
    stop_changed_.wait_for(lock, interval, [&] { return stop_; });
    if (stop_ || comm_ == nullptr) continue;
    poll();
  }
}

void GuardedComm::poll() {
  const std::string where = " on " + where_;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t status = ncclCommGetAsyncError(comm_, &state);
  if (status != ncclSuccess) state = status;
  if (state != ncclSuccess && state != ncclInProgress) {
    const std::string what = in_flight_.empty() ? "the NCCL communicator" : in_flight_.front().what;
    fail(error_kind(state), what + where + ": NCCL reported an asynchronous error: " +
                                status_text(state, comm_) + "; aborted the NCCL communicator");
    return;
  }
  const auto now = Clock::now();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    const cudaError_t done = cudaEventQuery(it->end);
    if (done == cudaSuccess) {
      spare_events_.push_back(it->start);
      spare_events_.push_back(it->end);
      it = in_flight_.erase(it);
      continue;
    }
    if (done != cudaErrorNotReady) {
      (void)cudaGetLastError();
      fail(ErrorKind::kDevice, it->what + where +
                                   ": cudaEventQuery failed: " + cudaGetErrorName(done) + " (" +
                                   cudaGetErrorString(done) + "); aborted the NCCL communicator");
      return;
    }
    // Note: the clock starts when the stream reaches the collective, not when it was issued:
    // work queued before it on the stream (a long backward) is not a stalled peer.
    if (!it->started && cudaEventQuery(it->start) == cudaSuccess) it->started = now;
    if (it->started && now - *it->started > timeout_) {
      fail(ErrorKind::kCommTimeout,
           it->what + where + " did not finish within " + timeout_text() +
               ": aborted the NCCL communicator; a peer rank may have died or issued different "
               "collectives (world.timeout_s sets the limit)");
      return;
    }
    ++it;
  }
}

}  // namespace zest::nccl
