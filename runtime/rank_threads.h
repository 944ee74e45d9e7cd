// Ranks as threads of this process, started and waited for as both thread backends of World need
// (`local`, and NCCL with one GPU per thread). Two things a plain start-and-join gets wrong:
// a rank thread the system refuses is that rank's failure naming the limit (thread_start.h),
// not joinable threads left to std::terminate; and the wait is bounded — once a rank has failed
// (FirstFailure, which a communicator feeds the moment a collective times out), the others get
// WorldOptions::grace to end, or less when WorldOptions::interrupted says so, after which the
// process is ended with the failure's one line (process_end.h). A rank stalled in compute or
// I/O cannot be stopped, and returning without it would free what it still uses.
// Internal to World's backends.
#pragma once

#include <functional>
#include <string>

#include "runtime/first_failure.h"
#include "runtime/world.h"

namespace zest::detail {

// Runs `run(rank)` on a thread per rank (rank 0 .. options.ranks - 1) and waits as above; then
// throws the first failure, if any. `run` reports its failures to `failures` itself. When a
// thread cannot be started, its failure is offered, `release(reason)` is called so that the
// ranks already running fail their collectives at once (they would wait for the missing rank),
// and no more are started.
void run_rank_threads(const WorldOptions& options, FirstFailure& failures,
                      const std::function<void(int rank)>& run,
                      const std::function<void(int rank, const std::string& reason)>& release);

}  // namespace zest::detail
