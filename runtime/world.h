// The ranks of a data-parallel group and how they are started. A World runs one function per
// rank with that rank's context — its device, streams, communicator — and joins them. With the
// `local` backend the ranks are threads of this process; with `mpi` they are processes that a
// launcher started (mpirun, srun), and run() runs the function once, for this process's rank;
// `auto` detects which (world_detection.h). Invariant: run() returns only after every rank has
// finished, and if any rank failed it throws the first failure (the cause, not the peers' echoes
// of it), naming its rank — except that it never waits without bound for a rank that cannot
// finish: a failing process of a multi-process world ends the whole job (it prints its error,
// then MPI_Abort), since its peers could otherwise wait forever, and with threads, a rank still
// running WorldOptions::grace after another failed (stalled in compute, a collective or I/O)
// makes the World end the process with the failure's one line.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "memory/allocator.h"
#include "runtime/communicator.h"
#include "runtime/core_pinning.h"
#include "runtime/device.h"
#include "runtime/link_model.h"
#include "runtime/topology.h"
#include "runtime/trace.h"
#include "runtime/world_detection.h"

namespace zest {

struct WorldOptions {
  int ranks = 1;                  // threads; with processes, 1 (unset) or the launcher's count
  // Consecutive ranks per node (runtime/topology.h). 0: the launcher's count where it says
  // (world_detection.h), else every rank on one node (always so for threads unless set). World
  // resolves it: options() holds the number in use.
  int ranks_per_node = 0;
  // The modelled inter-node network and its "auto" (link_model.h); World resolves `modelled`.
  LinkOptions link;
  std::string backend = "local";  // "local", "mpi" or "auto" (world_detection.h)
  DeviceKind device = DeviceKind::kCpu;
  std::size_t device_memory = kUnlimitedCapacity;  // per rank, bytes
  // Per rank, bytes: the host memory an offloaded optimizer lives in (Device::host_allocator).
  std::size_t host_memory = kUnlimitedCapacity;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Ranks as threads on the CPU device: pinned to cores when they outnumber them (kAuto), always
  // (kOn) or never (kOff); runtime/core_pinning.h. kAuto defers to env ZEST_PIN_RANKS when set
  // (config world.pin_ranks).
  RankPinning pin_ranks = RankPinning::kAuto;
  // Debug: every collective sleeps this long before it starts, to widen race windows in tests
  // (config debug.collective_delay_ms, or env ZEST_DEBUG_COLLECTIVE_DELAY_MS when this is 0).
  std::chrono::milliseconds collective_delay{0};
  // Debug, CPU device: a stream-ordered free runs only once a wait proves its stream passed it
  // (runtime/cpu_stream.h, FreeTiming::kWhenWaited), the order the planner replays, so measured
  // peaks equal the plan however the threads are scheduled (config debug.hold_frees; the plan's
  // tests set it).
  bool hold_frees = false;
  // Debug: ranks compare a record of every collective before issuing it, so ranks that issue
  // different collectives fail with a message naming the first difference instead of hanging
  // (checked_communicator.h; config debug.check_collectives). Unset: env ZEST_CHECK_COLLECTIVES=1
  // turns it on (the test suites set it).
  std::optional<bool> check_collectives;
  // When set, every rank's streams record their collectives and the engine its units' compute
  // here (log.trace / wall_clock_breakdown).
  std::shared_ptr<TraceRecorder> trace;
  // Names the program in the line a failing process prints before it ends a multi-process job,
  // or before a World of threads ends the process: "<program>: error: rank 2: ...".
  std::string program = "zest";
  // Threads: once a rank has failed, how long the other ranks get to end before the World ends
  // the process without them (see run()). They normally end at once: the failure fails every
  // collective they are in or issue. What outlasts it is stalled (a sleep, a read that never
  // returns), and a thread cannot be stopped.
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
  // Threads: polled while the World waits out `grace`; true ends the wait at once (the tools
  // pass "a SIGINT or SIGTERM arrived"). Processes: how a failing process learns that the
  // launcher is already ending the job (process_world.h). Unset: never.
  std::function<bool()> interrupted;
  // Threads: a World whose ranks have not stopped `grace` after `interrupted` turned true (a
  // rank asleep, stalled or evaluating without end) ends the process with one line and this
  // exit status (the tools: 128 + the signal). Unset: 1.
  std::function<int()> interrupted_status;
  // Runs on the thread that ends the process — a World of threads after `grace`, a failing
  // process of a multi-process job — just before the one error line is printed: end a live
  // progress line, remove partial output files. Quick, and without locks that a stalled thread
  // could hold.
  std::function<void()> before_exit;
};

// Everything one rank works with. Streams: `compute` runs the model; `comm` runs gradient
// reductions and parameter gathers; `prefetch` runs ZeRO-3's gathers ahead of use.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  Device& device;
  Stream& compute;
  Stream& comm;
  Stream& prefetch;
  Communicator& communicator;
  TraceRecorder* trace = nullptr;  // null unless WorldOptions::trace is set
  Topology topology{};             // which node each world rank runs on
  // What this rank has put on the wire, intra- and inter-node (link_model.h); null outside a
  // World (a context a test builds by hand).
  const WireCounter* wire = nullptr;
  // Hybrid sharding (engine/hybrid_shards.h) hands the trainer its shard group's view of a rank:
  // `rank`, `world_size` and `communicator` are then the shard group's, `replicas` is how many
  // shard groups hold the same shards, and `world_rank` the rank in the world.
  int replicas = 1;
  int world_rank = -1;  // -1: `rank` is the world's
  int rank_in_world() const { return world_rank < 0 ? rank : world_rank; }
  // This rank's node (topology.node_of of its world rank).
  int node() const { return topology.node_of(rank_in_world()); }

  Allocator& allocator() const { return device.allocator(); }
  // Waits for all of this rank's streams; throws a stream's own error before a peer failure
  // that only echoes it (a stream that waited on a failed stream's event).
  void synchronize() const;
};

class World {
 public:
  // Detects the world (world_detection.h). With processes it initializes MPI for this process
  // (once; finalized at exit) and checks MPI's rank and size against the launcher's environment.
  explicit World(WorldOptions options);

  int size() const { return detected_.size; }
  // As given, with `ranks` the world's size.
  const WorldOptions& options() const { return options_; }
  const DetectedWorld& detected() const { return detected_; }
  // True in the process that runs rank 0: the one that prints and writes files.
  bool is_leader_process() const { return detected_.rank == 0; }

  // Runs `work` once per rank of this process — every rank with threads, this process's rank
  // with processes — and joins. Throws the first failure as "rank R: ...". With several
  // processes, a failure is printed to stderr and ends the job with MPI_Abort, exit status 2 for
  // input errors (Error kinds config, data, usage, checkpoint) and 1 otherwise.
  void run(const std::function<void(RankContext&)>& work) const;

  // Checks that every process was started with the same configuration: all-gathers a hash
  // (xxHash3) of `text` — the resolved config, less anything rank-specific — and throws, on every
  // process alike, a kConfig Error naming the ranks whose hash differs from rank 0's. A no-op
  // with threads, which share one config. Call it before any training.
  void verify_same_config(const std::string& text) const;

  // For a failure outside run() with several processes (a metrics file rank 0 cannot create, a
  // config mismatch): prints "<program>: error: <what>" and ends the job with MPI_Abort, exit
  // status 2 for input errors and 1 otherwise, since the other processes may be waiting for this
  // one in a collective (or in MPI_Finalize). Returns with threads or one process: the caller
  // then reports the error as usual.
  void end_job_on_failure(const std::exception& error) const;

 private:
  WorldOptions options_;
  DetectedWorld detected_;
};

}  // namespace zest
