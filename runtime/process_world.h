// The process side of World: one rank per process, connected by MPI. Internal to World (world.cc
// calls it; nothing else should); defined in process_world_mpi.cc, so built only with MPI.
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "base/error.h"
#include "runtime/world.h"

namespace zest::detail {

// Initializes MPI for this process and returns `detected` with MPI's own rank and size, after
// checking that they are what the launcher's environment said. Throws kConfig when they differ.
DetectedWorld start_processes(const DetectedWorld& detected);

// Runs `work` for this process's rank. A failure with more than one process prints
// "<program>: error: rank R: ..." and ends the job (MPI_Abort); with one it is thrown.
void run_process_rank(const WorldOptions& options, const DetectedWorld& world,
                      const std::function<void(RankContext&)>& work);

// Runs options.before_exit, prints "<program>: error: <what>" and ends every process of the job
// with MPI_Abort, exit status 2 for input errors and 1 otherwise. A communication failure, which
// every healthy process sees at once, is printed by the lowest rank only: a higher rank waits
// (600 ms a rank, at most 3 s) and ends silently once options.interrupted says the launcher is
// ending the job.
[[noreturn]] void end_job(const WorldOptions& options, const std::exception& error);

// What a process reports when its rank failed with `error`: `error`, unless it is a
// communication error (a timeout, a mismatch, a peer failure: the communicator's failure as a
// stream re-raised it, or an echo of it) and `cause`, the communicator's first failure, is known
// and not itself an echo: then `cause`.
const std::exception& cause_of(const std::exception& error, const std::optional<Error>& cause);

// World::verify_same_config for processes.
void verify_same_config_across_processes(const std::string& text, const DetectedWorld& world,
                                         std::chrono::milliseconds timeout);

}  // namespace zest::detail
