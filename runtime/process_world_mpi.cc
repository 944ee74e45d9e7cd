#include "runtime/process_world.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "runtime/cpu_device.h"
#include "runtime/cpu_stream.h"
#include "runtime/mpi_communicator.h"
#include "runtime/mpi_process.h"
#include "runtime/process_end.h"
#include "runtime/rank_resources.h"

namespace zest::detail {

namespace {

std::string hex(std::uint64_t value) {
  char text[19];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

DetectedWorld start_processes(const DetectedWorld& detected) {
  const MpiProcess& process = MpiProcess::get();
  if (process.size() != detected.size || process.rank() != detected.rank) {
    // Note: typically a Slurm batch script that runs the program directly instead of through
    // srun, or an srun whose MPI lacks Slurm's PMI/PMIx: every process then starts as an MPI
    // world of its own.
    throw Error(ErrorKind::kConfig,
                "the " + detected.launcher + " environment says this process is rank " +
                    std::to_string(detected.rank) + " of " + std::to_string(detected.size) +
                    ", but MPI started it as rank " + std::to_string(process.rank()) + " of " +
                    std::to_string(process.size()) +
                    "; launch through mpirun, or srun with an MPI built for Slurm (PMIx)");
  }
  DetectedWorld world = detected;
  world.rank = process.rank();
  world.size = process.size();
  return world;
}

void run_process_rank(const WorldOptions& options, const DetectedWorld& world,
                      const std::function<void(RankContext&)>& work) {
  const int rank = world.rank;
  std::optional<Error> communicator_failure;
  try {
    MpiCommunicator communicator(options.timeout);
    try {
      cpu::CpuDevice device(rank, options.device_memory, options.host_memory,
                          options.hold_frees ? cpu::FreeTiming::kWhenWaited
                                               : cpu::FreeTiming::kWhenReached);
      RankResources resources(rank, world.size, device, communicator, options);
      work(resources.context());
      resources.context().synchronize();
    } catch (const std::exception&) {
      communicator_failure = communicator.failure();
      throw;
    }
  } catch (const std::exception& error) {
    const Error failure =
        with_context(cause_of(error, communicator_failure), "rank " + std::to_string(rank));
    if (world.size == 1) raise(failure);
    // Note: a failed process ends the job rather than returning: its peers may be waiting in a
    // collective it will never join, and MPI cannot cancel that.
    end_job(options, failure);
  }
}

const std::exception& cause_of(const std::exception& error, const std::optional<Error>& cause) {
  if (!cause || cause->kind() == ErrorKind::kPeerFailure) return error;
  // Note: a communication error raised by the rank is the communicator's failure again — as a
  // stream re-raised it ("stream 'rank 0 comm': ..."), or a wait on that stream's event — or a
  // later one that the first caused; the first, as it happened, is the one to report.
  const auto* zest_error = dynamic_cast<const Error*>(&error);
  const ErrorKind kind = zest_error ? zest_error->kind() : ErrorKind::kInternal;
  const bool communication = kind == ErrorKind::kPeerFailure || kind == ErrorKind::kCommTimeout ||
                             kind == ErrorKind::kCommMismatch;
  return communication ? *cause : error;
}

void end_job(const WorldOptions& options, const std::exception& error) {
  const auto* zest_error = dynamic_cast<const Error*>(&error);
  const Error failure = zest_error ? *zest_error : Error(ErrorKind::kInternal, error.what());
  const ErrorKind kind = failure.kind();
  const bool seen_by_many = kind == ErrorKind::kCommTimeout || kind == ErrorKind::kCommMismatch ||
                            kind == ErrorKind::kPeerFailure;
  if (seen_by_many && options.interrupted) {
    // Note: every healthy process times out (or sees a mismatch) at about the same moment, and
    // each would print its own line. The lowest rank reports; a higher one first waits 600 ms
    // per rank below it (at most 3 s) — longer than a report and its pause — and ends silently
    // if the launcher meanwhile began ending the job (its SIGTERM, which `interrupted` sees):
    // one line for the job, not one per process.
    const auto wait = std::min(std::chrono::milliseconds(600) * MpiProcess::get().rank(),
                               std::chrono::milliseconds(3000));
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < deadline) {
      if (options.interrupted()) MpiProcess::get().abort(exit_status(failure));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  report_failure(options, failure);
  // Note: the launcher forwards each process's stderr asynchronously, and MPI_Abort tears the
  // job down at once: without a pause the one line that says what failed is often lost.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  MpiProcess::get().abort(exit_status(failure));
}

void verify_same_config_across_processes(const std::string& text, const DetectedWorld& world,
                                         std::chrono::milliseconds timeout) {
  const std::uint64_t hash = XXH3_64bits(text.data(), text.size());
  std::vector<std::uint64_t> hashes(static_cast<std::size_t>(world.size));
  {
    MpiCommunicator communicator(timeout);
    cpu::CpuStream stream("config check");
    // Moved as pairs of int32: all_gather moves bits, whatever the dtype says.
    communicator.all_gather(stream, &hash, hashes.data(), 2, DType::kInt32);
    stream.synchronize();
  }
  std::string differing;
  for (std::size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] == hashes[0]) continue;
    differing += (differing.empty() ? "" : ", ") + std::to_string(r) + " (" + hex(hashes[r]) + ")";
  }
  if (differing.empty()) return;
  throw Error(ErrorKind::kConfig,
              "the processes were started with different configs: rank(s) " + differing +
                  " differ from rank 0 (" + hex(hashes[0]) +
                  ") in the xxh3 hash of the resolved config; start every process with the same "
                  "config file and --set overrides");
}

}  // namespace zest::detail
