// How the runtime ends the process itself after a failure, where returning is unsafe or useless:
// a rank thread stalled in compute or I/O cannot be stopped, and returning without it would free
// what it still uses; a failed process of an MPI job must end the job, or its peers wait for it.
// Internal to World's backends. Invariant: the user sees exactly one line,
// "<program>: error: <message>", written after WorldOptions::before_exit has run, with no lock
// taken that another thread could hold (a stalled thread may be inside anything).
#pragma once

#include "base/error.h"
#include "runtime/world.h"

namespace zest::detail {

// 2 for input errors (config, data, usage, checkpoint), 1 otherwise: as the tools exit.
int exit_status(const Error& error);

// Runs options.before_exit (whatever it throws is ignored), then writes the line to stderr.
void report_failure(const WorldOptions& options, const Error& error);

// report_failure, then std::_Exit(exit_status): no destructor runs, no thread is joined.
[[noreturn]] void end_process(const WorldOptions& options, const Error& error);
// The same with the exit status given (an unheeded interruption ends as the signal would have).
[[noreturn]] void end_process(const WorldOptions& options, const Error& error, int status);

}  // namespace zest::detail
