// Ranks as threads of one process (the local backend, the CPU device) that outnumber the cores
// run pinned: each rank's threads — its own and its streams' workers, which inherit it — on one
// core, rank r on the (r % n)-th core the process may use. Unpinned, four ranks on two cores
// moved between the cores hundreds of times a step (each move a cold cache), and two ranks'
// products could hold the process-wide product gate on one core while the other core idled;
// pinned, a core's ranks take turns and the gate (kernels/matmul.cc) lets one product run per
// core: a GPT step at 4 ranks on 2 cores took 222 ms instead of 270 (1 rank: 105). With no more
// ranks than cores nothing is pinned. world.pin_ranks "off" (or ZEST_PIN_RANKS=0 where the config
// leaves it at "auto") turns pinning off: on a machine busy with other work a pinned rank cannot
// leave a loaded core, and its peers wait for it at every collective. "on" (ZEST_PIN_RANKS=1)
// pins whenever there are two ranks and two cores. Processes (MPI) are placed by their launcher
// (mpirun --bind-to), and CUDA ranks are never pinned.
#pragma once

#include <vector>

namespace zest {

// Whether ranks as threads are pinned: when they outnumber the cores, always, or never.
enum class RankPinning { kAuto, kOn, kOff };

// ZEST_PIN_RANKS's value as a pinning: "0" off, "1" on, anything else or unset (null) auto.
RankPinning pinning_from_environment(const char* value);

// The cores this process may run on (sched_getaffinity), in order; empty when unknown.
std::vector<int> allowed_cores();

// The core rank `rank` of `ranks` threads runs on, or -1: not pinned (no more ranks than cores
// unless kOn, one rank, fewer than two cores known, or kOff).
int rank_core(int rank, int ranks, const std::vector<int>& cores, RankPinning pinning);

// Restricts the calling thread (and the threads it starts from now on) to `core`. Returns false
// if the system refused; the rank then runs unpinned.
bool pin_this_thread(int core);

// The one core the calling thread may run on, or -1 when it may run on several. Read once per
// thread and kept: a rank's threads are pinned before they start.
int this_thread_core();

}  // namespace zest
