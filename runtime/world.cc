#include "runtime/world.h"

#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "runtime/local_communicator.h"

namespace zest {

void RankContext::synchronize() const {
  compute.synchronize();
  comm.synchronize();
  prefetch.synchronize();
}

World::World(WorldOptions options) : options_(std::move(options)) {
  if (options_.ranks < 1) {
    throw Error(ErrorKind::kConfig,
                "world.ranks: must be >= 1, got " + std::to_string(options_.ranks));
  }
  if (options_.backend != "local") {
    throw Error(ErrorKind::kConfig, "world.backend: '" + options_.backend +
                                        "' is not available in this build (allowed: local)");
  }
  if (options_.device != DeviceKind::kCpu) {
    throw Error(ErrorKind::kConfig,
                "world.device: the local backend runs on the cpu device (allowed: cpu)");
  }
  if (options_.timeout.count() <= 0) {
    throw Error(ErrorKind::kConfig, "world.timeout_s: must be > 0");
  }
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
    cpu::CpuDevice device(rank, options.device_memory);
    const std::string prefix = "rank " + std::to_string(rank) + " ";
    // Note: streams are destroyed (drained) before the device, and only after a failure has
    // poisoned the group, so queued collectives fail fast instead of waiting out the timeout.
    auto compute = device.create_stream(prefix + "compute");
    auto comm = device.create_stream(prefix + "comm");
    auto prefetch = device.create_stream(prefix + "prefetch");
    RankContext context{rank, options.ranks, device, *compute, *comm, *prefetch, communicator};
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
  auto communicators = LocalCommunicator::create_group(options_.ranks, options_.timeout);
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

}  // namespace zest
