// Where a run's ranks come from: threads of this process, or processes a launcher started
// (mpirun, srun). Decided in this order: the explicit config (world.backend "local": threads;
// "mpi": processes), then, for "auto", the launcher's environment — Open MPI
// (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), torchrun-style (RANK,
// WORLD_SIZE, LOCAL_RANK; LOCAL_WORLD_SIZE for the ranks per node) — and otherwise threads. Invariant: processes always talk over MPI
// (zest has no transport of its own), so an environment that says "processes" without an MPI
// launcher is an error that says how to launch, never a silent run of N unconnected copies.
#pragma once

#include <functional>
#include <string>

namespace zest {

struct DetectedWorld {
  bool processes = false;    // ranks are processes, one rank each; false: threads of this one
  int size = 1;              // ranks in the world
  int rank = 0;              // this process's rank (0 with threads: this process has them all)
  int local_rank = 0;        // this process's rank among those on its machine
  // Ranks on each machine as the launcher says (OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE
  // or an even SLURM_TASKS_PER_NODE, LOCAL_WORLD_SIZE); 0: it did not say, or nodes differ.
  int ranks_per_node = 0;
  std::string backend;       // "local" or "mpi"
  std::string launcher;      // "threads", "Open MPI", "Slurm", "MPI singleton"

  // "4 processes (Open MPI), rank 0 local 0" or "4 threads of one process".
  std::string describe() const;
};

// Reads an environment variable; nullptr where it is unset.
using EnvReader = std::function<const char*(const char*)>;

// Detects the world for `backend` ("local", "mpi" or "auto") and `ranks` (world.ranks: the
// thread count; with processes it must be 1 — unset — or equal the launcher's count). Reads the
// process environment unless `env` is given. Throws a kConfig Error that says how to launch when
// the config and the environment disagree. Does not initialize MPI: World does, and checks MPI's
// own rank and size against this.
DetectedWorld detect_world(const std::string& backend, int ranks, const EnvReader& env = {});

}  // namespace zest
