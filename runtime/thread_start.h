// Starting a thread the runtime needs: a rank's, a stream's worker, a watchdog. A thread the
// system refuses — the per-user limit on processes and threads (ulimit -u, RLIMIT_NPROC),
// kernel.threads-max, a cgroup's pids.max, memory for its stack — is a kDevice Error naming
// what could not start and the limits, never a std::system_error on its way to terminate.
// Debug: ZEST_DEBUG_FAIL_THREAD_START=N (or fail_nth_thread_start) makes the Nth thread started
// through here from then on fail as the system would (EAGAIN), so that tests reach every path.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace zest {

// Starts `body` on a new thread. `what` names it in the error: "the thread of rank 3".
std::thread start_thread(const std::string& what, std::function<void()> body);

namespace detail {

// Test hook: the `n`th call of start_thread from now on fails (0: none). Overrides the
// environment.
void fail_nth_thread_start(long n);

}  // namespace detail

}  // namespace zest
