#include "runtime/world.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "runtime/core_pinning.h"
#include "runtime/cpu_device.h"
#include "runtime/first_failure.h"
#if ZEST_HAVE_CUDA
#include "runtime/cuda_device.h"
#include "runtime/cuda_world.h"
#endif
#include "runtime/local_communicator.h"
#include "runtime/rank_resources.h"
#include "runtime/rank_threads.h"
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

// Which backends run on which device (docs/architecture.md, "The CUDA device"): `local` and `mpi`
// move host memory, so they serve the CPU device; `nccl` moves device memory and serves the CUDA
// device; `auto` picks the device's. Throws a kConfig Error that says what to set instead.
void check_backend_for_device(const WorldOptions& options) {
  const std::string& backend = options.backend;
  if (options.device == DeviceKind::kCpu) {
    if (backend == "nccl") {
      throw Error(ErrorKind::kConfig,
                  "world.backend: 'nccl' moves GPU memory and runs with world.device \"cuda\"; "
                  "with world.device \"cpu\" use one of: " + std::string(kBackends));
    }
    const bool known = backend == "local" || backend == "auto" || (kHaveMpi && backend == "mpi");
    if (!known) {
      throw Error(ErrorKind::kConfig, "world.backend: '" + backend +
                                          "' is not available in this build (allowed: " +
                                          kBackends + ")");
    }
    return;
  }
#if ZEST_HAVE_CUDA
  if (backend != "nccl" && backend != "auto") {
    throw Error(ErrorKind::kConfig,
                "world.device: \"cuda\" needs world.backend \"nccl\" (or \"auto\"): the '" +
                    backend + "' backend moves host memory, and NCCL moves the GPUs' (for "
                    "processes, MPI only sends NCCL its unique id)");
  }
  cuda::select_device(0);  // a kConfig Error saying what CUDA reported when no GPU is visible
#else
  throw Error(ErrorKind::kConfig,
              "world.device: \"cuda\" needs zest built with CUDA (configure with "
              "-DZEST_CUDA=ON where nvcc is installed); this build has the cpu device only "
              "(allowed: cpu)");
#endif
}

}  // namespace

World::World(WorldOptions options) : options_(std::move(options)) {
  if (options_.ranks < 1) {
    throw Error(ErrorKind::kConfig,
                "world.ranks: must be >= 1, got " + std::to_string(options_.ranks));
  }
  check_backend_for_device(options_);
  if (options_.timeout.count() <= 0) {
    throw Error(ErrorKind::kConfig, "world.timeout_s: must be > 0");
  }
  // Note: checked here too, for the environment's delay: one of the timeout or more makes every
  // collective sleep past it, deaf to the timeout and to signals.
  if (const auto delay = collective_delay(options_); delay >= options_.timeout) {
    throw Error(ErrorKind::kConfig,
                "debug.collective_delay_ms (or env ZEST_DEBUG_COLLECTIVE_DELAY_MS): must be below "
                "world.timeout_s (" + seconds_text(options_.timeout) + "), got " +
                    std::to_string(delay.count()) + " ms");
  }
  // Note: nccl's ranks are found as auto's are: threads, unless a launcher started processes
  // (whose NCCL unique id then travels over MPI).
  const bool nccl = options_.device == DeviceKind::kCuda;
  detected_ = detect_world(nccl ? "auto" : options_.backend, options_.ranks);
  if (nccl) detected_.backend = "nccl";
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
  // Note: the config wins over the launcher, so a one-machine run can model several nodes.
  const int ranks_per_node = options_.ranks_per_node > 0 ? options_.ranks_per_node
                             : detected_.ranks_per_node > 0 ? detected_.ranks_per_node
                                                            : detected_.size;
  options_.ranks_per_node = Topology(detected_.size, ranks_per_node).ranks_per_node();
  // Threads of one process share memory: nodes exist only in the model, so "auto" models the
  // link. Processes (and GPUs) have real links, whose time is already in every collective.
  if (!options_.link.modelled) options_.link.modelled = !detected_.processes && !nccl;
  if (!(options_.link.bandwidth_gbit_s > 0.0) || !(options_.link.latency_us >= 0.0)) {
    throw Error(ErrorKind::kConfig, "world.link: bandwidth_gbit_s must be > 0 and latency_us >= 0");
  }
#if ZEST_HAVE_CUDA
  if (nccl) {
    // Each rank its own GPU (NCCL forbids two ranks on one): threads take GPUs 0..n-1, a process
    // the GPU of its local rank. Said here, before anything runs, rather than by NCCL later.
    cuda::select_device(detected_.processes ? detected_.local_rank : detected_.size - 1);
  }
#endif
}

namespace {

ErrorKind kind_of(const std::exception& error) {
  const auto* zest_error = dynamic_cast<const Error*>(&error);
  return zest_error ? zest_error->kind() : ErrorKind::kInternal;
}

void run_rank(int rank, const WorldOptions& options, LocalCommunicator& communicator,
              const std::function<void(RankContext&)>& work, detail::FirstFailure& failures,
              int core) {
  // Before the device and its streams: their workers inherit the core (core_pinning.h).
  if (core >= 0) pin_this_thread(core);
  LocalGroup& group = communicator.group();
  // Offered before the group is poisoned: the rank's own error, with its type, is the cause.
  const auto fail = [&](const std::exception& error) {
    failures.offer(rank, error);
    group.poison(rank, kind_of(error), error.what());
  };
  try {
    cpu::CpuDevice device(rank, options.device_memory, options.host_memory,
                          options.hold_frees ? cpu::FreeTiming::kWhenWaited
                                               : cpu::FreeTiming::kWhenReached);
    // Note: streams are destroyed (drained) before the device, and only after a failure has
    // poisoned the group, so queued collectives fail fast instead of waiting out the timeout.
    detail::RankResources resources(rank, options.ranks, device, communicator, options);
    RankContext& context = resources.context();
    try {
      work(context);
      context.synchronize();
    } catch (const std::exception& error) {
      fail(error);
      return;
    }
    group.depart(rank);
  } catch (const std::exception& error) {
    fail(error);
  }
}

}  // namespace

void World::run(const std::function<void(RankContext&)>& work) const {
  const bool cuda = options_.device == DeviceKind::kCuda;
#if ZEST_HAVE_MPI
  if (detected_.processes) {
#if ZEST_HAVE_CUDA
    if (cuda) return detail::run_cuda_process_rank(options_, detected_, work);
#endif
    return detail::run_process_rank(options_, detected_, work);
  }
#endif
#if ZEST_HAVE_CUDA
  if (cuda) return detail::run_cuda_threads(options_, work);
#endif
  (void)cuda;
  auto communicators = LocalCommunicator::create_group(options_.ranks, options_.timeout);
  for (auto& communicator : communicators) {
    communicator->set_delay(collective_delay(options_));
    communicator->set_trace(options_.trace.get());
  }
  detail::FirstFailure failures;
  LocalGroup& group = communicators.front()->group();
  // The first failure is kept when it happens — the first rank to time out — not when its
  // rank has unwound, by which time its peers' echoes may have been offered.
  group.set_failure_observer(
      [&failures](int rank, const Error& failure) { failures.offer(rank, failure); });
  const std::vector<int> cores = allowed_cores();
  const RankPinning pinning = options_.pin_ranks != RankPinning::kAuto
                                  ? options_.pin_ranks
                                  : pinning_from_environment(std::getenv("ZEST_PIN_RANKS"));
  detail::run_rank_threads(
      options_, failures,
      [&](int rank) {
        run_rank(rank, options_, *communicators[rank], work, failures,
                 rank_core(rank, options_.ranks, cores, pinning));
      },
      [&](int rank, const std::string& reason) { group.poison(rank, ErrorKind::kDevice, reason); });
}

void World::end_job_on_failure([[maybe_unused]] const std::exception& error) const {
#if ZEST_HAVE_MPI
  if (detected_.processes && detected_.size > 1) detail::end_job(options_, error);
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
