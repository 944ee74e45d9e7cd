// Whether this host can start the ranks a config asks for as threads of one process, checked
// before any rank, buffer or thread exists: each rank is a thread with its stream threads, and
// together they hold at least their gathered units and activations in the host's memory. A
// world this host cannot hold (world.ranks 65536) is refused with one line naming the limit,
// instead of taking every byte of memory until the kernel kills the process.
// Invariant: the counts are lower bounds of what the ranks use, so no refused world could run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/train_config.h"

namespace zest {

// What the host allows: the most threads and bytes, and what sets each (for the message).
struct HostLimits {
  std::uint64_t threads = 0;  // 0: unknown (not checked)
  std::string threads_source;  // "kernel.pid_max", "kernel.threads-max", "RLIMIT_NPROC"
  std::uint64_t memory = 0;    // bytes; 0: unknown (not checked)
};

// Read from /proc/sys/kernel and getrlimit, sysconf.
HostLimits host_limits();

// The least threads and host bytes the config's ranks take as threads of one process.
struct RankFloor {
  std::uint64_t threads = 0;
  std::uint64_t bytes = 0;
};
RankFloor rank_floor(const TrainConfig& config);

// Throws a kConfig Error naming world.ranks, what the ranks need and the host's limit, when the
// ranks are threads (world.backend "local", the cpu device) and need more than `limits` allow.
void check_ranks_fit_host(const TrainConfig& config, const HostLimits& limits);

}  // namespace zest
