#include "runtime/core_pinning.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include <cstring>

namespace zest {

std::vector<int> allowed_cores() {
  std::vector<int> cores;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cores.push_back(cpu);
  }
#endif
  return cores;
}

RankPinning pinning_from_environment(const char* value) {
  if (value != nullptr && std::strcmp(value, "0") == 0) return RankPinning::kOff;
  if (value != nullptr && std::strcmp(value, "1") == 0) return RankPinning::kOn;
  return RankPinning::kAuto;
}

int rank_core(int rank, int ranks, const std::vector<int>& cores, RankPinning pinning) {
  const auto count = static_cast<int>(cores.size());
  if (ranks < 2 || count < 2 || pinning == RankPinning::kOff) return -1;
  if (pinning == RankPinning::kAuto && ranks <= count) return -1;
  return cores[static_cast<std::size_t>(rank % count)];
}

bool pin_this_thread(int core) {
#if defined(__linux__)
  if (core < 0 || core >= CPU_SETSIZE) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  return sched_setaffinity(0, sizeof(set), &set) == 0;
#else
  (void)core;
  return false;
#endif
}

int this_thread_core() {
  thread_local const int core = [] {
    const std::vector<int> cores = allowed_cores();
    return cores.size() == 1 ? cores.front() : -1;
  }();
  return core;
}

}  // namespace zest
