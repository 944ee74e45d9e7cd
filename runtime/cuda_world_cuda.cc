// World's ranks as threads of this process, one GPU each (rank r on GPU r), with NCCL.
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda_device.h"
#include "runtime/cuda_world.h"
#include "runtime/first_failure.h"
#include "runtime/nccl_communicator.h"
#include "runtime/rank_resources.h"
#include "runtime/rank_threads.h"

namespace zest::detail {

namespace {

using Group = std::vector<std::unique_ptr<NcclCommunicator>>;

// Note: every communicator of the group is aborted, the failed rank's own included. Its peers
// may wait in a collective it will never join, and its own queued collectives wait for peers
// that will not join them either; aborting makes those kernels exit, so every stream drains
// now instead of at the watchdog's timeout.
void abort_group(Group& group, int rank, const std::string& what) {
  const std::string reason = "rank " + std::to_string(rank) + " failed: " + what;
  for (auto& communicator : group) communicator->abort(reason);
}

void run_rank(int rank, const WorldOptions& options, Group& group,
              const std::function<void(RankContext&)>& work, FirstFailure& failures) {
  try {
    cuda::CudaDevice device(rank, options.device_memory, options.host_memory);
    // Note: ranks that are threads of one process are one process to NCCL, which then reads and
    // writes a peer GPU's buffers directly over P2P (its "P2P/direct pointer" path; what
    // NCCL_P2P_DIRECT_DISABLE turns off), and the pool's memory is reachable from its own GPU
    // only until granted: without this, the peers' NCCL kernels fault on it (illegal address).
    for (int peer = 0; peer < options.ranks; ++peer) {
      device.pool_allocator().grant_peer_access(peer);
    }
    // Streams are destroyed (drained) before the device, after a failure has aborted the group.
    RankResources resources(rank, options.ranks, device, *group[rank], options);
    RankContext& context = resources.context();
    try {
      work(context);
      context.synchronize();
    } catch (const std::exception& error) {
      failures.offer(rank, error);
      abort_group(group, rank, error.what());
    }
  } catch (const std::exception& error) {
    failures.offer(rank, error);
    abort_group(group, rank, error.what());
  }
}

}  // namespace

void run_cuda_threads(const WorldOptions& options, const std::function<void(RankContext&)>& work) {
  Group group = NcclCommunicator::create_group(options.ranks, options.timeout);
  FirstFailure failures;
  // Note: as with the local backend, a rank still running `options.grace` after another failed
  // (a watchdog's timeout names the collective it waited in) ends the process without it:
  // its stream may be stuck behind a kernel the abort cannot reach, or its host thread in I/O.
  try {
    run_rank_threads(
        options, failures,
        [&](int rank) { run_rank(rank, options, group, work, failures); },
        [&](int rank, const std::string& reason) { abort_group(group, rank, reason); });
  } catch (...) {
    NcclCommunicator::destroy_group(group);
    throw;
  }
  NcclCommunicator::destroy_group(group);
}

}  // namespace zest::detail
