#include "runtime/world.h"

#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/error.h"
#include "runtime/checked_communicator.h"
#include "runtime/cpu_device.h"
#if ZEST_HAVE_CUDA
#include "runtime/cuda_device.h"
#endif
#include "runtime/local_communicator.h"
#if ZEST_HAVE_MPI
#include "runtime/process_world.h"
#endif

namespace zest {

void RankContext::synchronize() const {
  // Note: a stream that waited on an event of a failed stream fails with a peer failure that
  // only echoes the cause, so a stream's own failure is raised before such an echo (an
  // OutOfMemory on comm is not reported as compute's peer failure). Every stream is drained
  // before anything is raised: the caller frees buffers once this returns or throws, and a
  // stream still running would use them after the free.
  std::optional<Error> cause;
  std::optional<Error> echo;
  for (Stream* stream : {&compute, &comm, &prefetch}) {
    try {
      stream->synchronize();
    } catch (const Error& error) {
      std::optional<Error>& slot = error.kind() == ErrorKind::kPeerFailure ? echo : cause;
      if (!slot) slot = error;
    }
  }
  if (cause) raise(*cause);
  if (echo) raise(*echo);
}

namespace {

#if ZEST_HAVE_MPI
constexpr bool kHaveMpi = true;
constexpr const char* kBackends = "local, mpi, auto";
#else
constexpr bool kHaveMpi = false;
constexpr const char* kBackends = "local, auto";
#endif

// The configured debug delay, or ZEST_DEBUG_COLLECTIVE_DELAY_MS from the environment.
std::chrono::milliseconds collective_delay(const WorldOptions& options) {
  if (options.collective_delay.count() > 0) return options.collective_delay;
  const char* text = std::getenv("ZEST_DEBUG_COLLECTIVE_DELAY_MS");
  return std::chrono::milliseconds(text ? std::atol(text) : 0);
}

// Why world.device "cuda" is refused, most basic reason first: a build without CUDA, no GPU
// visible, or (until the engine runs on it) a CUDA device that the engine does not use yet.
std::string cuda_refusal(const std::string& backend) {
#if ZEST_HAVE_CUDA
  cuda::select_device(0);  // a kConfig Error saying what CUDA reported when no GPU is visible
  return "world.device: \"cuda\": the CUDA device and its kernels are built, but the engine and "
         "the " + backend + " backend do not run on it yet (allowed: cpu)";
#else
  (void)backend;
  return "world.device: \"cuda\" needs zest built with CUDA (configure with -DZEST_CUDA=ON "
         "where nvcc is installed); this build has the cpu device only (allowed: cpu)";
#endif
}

}  // namespace

World::World(WorldOptions options) : options_(std::move(options)) {
  if (options_.ranks < 1) {
    throw Error(ErrorKind::kConfig,
                "world.ranks: must be >= 1, got " + std::to_string(options_.ranks));
  }
  // Note: the nccl backend (CUDA devices) slots in here: detection is the same, and with
  // processes its bootstrap is an MpiCommunicator::broadcast of rank 0's ncclUniqueId.
  const bool known = options_.backend == "local" || options_.backend == "auto" ||
                     (kHaveMpi && options_.backend == "mpi");
  if (!known) {
    throw Error(ErrorKind::kConfig, "world.backend: '" + options_.backend +
                                        "' is not available in this build (allowed: " +
                                        kBackends + ")");
  }
  if (options_.device != DeviceKind::kCpu) {
    throw Error(ErrorKind::kConfig, cuda_refusal(options_.backend));
  }
  if (options_.timeout.count() <= 0) {
    throw Error(ErrorKind::kConfig, "world.timeout_s: must be > 0");
  }
  detected_ = detect_world(options_.backend, options_.ranks);
  if (detected_.processes) {
#if ZEST_HAVE_MPI
    detected_ = detail::start_processes(detected_);
#else
    throw Error(ErrorKind::kConfig,
                detected_.launcher + " started this process as rank " +
                    std::to_string(detected_.rank) + " of " + std::to_string(detected_.size) +
                    ", but this build of zest has no MPI to connect processes with (configure "
                    "with -DZEST_MPI=ON where an MPI is installed), or run one process with "
                    "world.backend \"local\"");
#endif
  }
  options_.ranks = detected_.size;
}

namespace {

// Keeps the first failure of a run; a failure that is only a peer's echo of another rank's
// failure is kept only if nothing better arrives.
class FirstFailure {
 public:
  void offer(int rank, const std::exception& error) {
    const auto* zest_error = dynamic_cast<const Error*>(&error);
    const bool echo = zest_error && zest_error->kind() == ErrorKind::kPeerFailure;
    std::lock_guard lock(mutex_);
    if (failure_ && (echo || !failure_is_echo_)) return;
    failure_ = with_context(error, "rank " + std::to_string(rank));
    failure_is_echo_ = echo;
  }
  void rethrow() const {
    if (failure_) raise(*failure_);
  }

 private:
  std::mutex mutex_;
  std::optional<Error> failure_;
  bool failure_is_echo_ = false;
};

void run_rank(int rank, const WorldOptions& options, LocalCommunicator& communicator,
              const std::function<void(RankContext&)>& work, FirstFailure& failures) {
  LocalGroup& group = communicator.group();
  try {
    cpu::CpuDevice device(rank, options.device_memory, options.host_memory);
    const std::string prefix = "rank " + std::to_string(rank) + " ";
    // Note: streams are destroyed (drained) before the device, and only after a failure has
    // poisoned the group, so queued collectives fail fast instead of waiting out the timeout.
    auto compute = device.create_stream(prefix + "compute");
    auto comm = device.create_stream(prefix + "comm");
    auto prefetch = device.create_stream(prefix + "prefetch");
    std::optional<CheckedCommunicator> checked;
    Communicator& used = maybe_checked(communicator, options.check_collectives, checked);
    RankContext context{rank, options.ranks, device, *compute, *comm, *prefetch, used,
                        options.trace.get()};
    try {
      work(context);
      context.synchronize();
    } catch (const std::exception& error) {
      group.poison(rank, error.what());
      failures.offer(rank, error);
      return;
    }
    group.depart(rank);
  } catch (const std::exception& error) {
    group.poison(rank, error.what());
    failures.offer(rank, error);
  }
}

}  // namespace

void World::run(const std::function<void(RankContext&)>& work) const {
#if ZEST_HAVE_MPI
  if (detected_.processes) return detail::run_process_rank(options_, detected_, work);
#endif
  auto communicators = LocalCommunicator::create_group(options_.ranks, options_.timeout);
  for (auto& communicator : communicators) {
    communicator->set_delay(collective_delay(options_));
    communicator->set_trace(options_.trace.get());
  }
  FirstFailure failures;
  std::vector<std::thread> threads;
  threads.reserve(options_.ranks);
  for (int rank = 0; rank < options_.ranks; ++rank) {
    threads.emplace_back(run_rank, rank, std::cref(options_), std::ref(*communicators[rank]),
                         std::cref(work), std::ref(failures));
  }
  for (auto& thread : threads) thread.join();
  failures.rethrow();
}

void World::end_job_on_failure([[maybe_unused]] const std::exception& error) const {
#if ZEST_HAVE_MPI
  if (detected_.processes && detected_.size > 1) detail::end_job(options_.program, error);
#endif
}

void World::verify_same_config([[maybe_unused]] const std::string& text) const {
#if ZEST_HAVE_MPI
  if (detected_.processes) {
    detail::verify_same_config_across_processes(text, detected_, options_.timeout);
  }
#endif
}

}  // namespace zest
