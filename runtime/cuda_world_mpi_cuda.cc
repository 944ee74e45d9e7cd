// World's rank as a process of an MPI job on the GPU of its local rank, with NCCL (its unique id
// sent over MPI). Built only with both CUDA and MPI (the _mpi_cuda.cc suffix).
#include <memory>
#include <optional>
#include <string>

#include "base/error.h"
#include "runtime/cuda_device.h"
#include "runtime/cuda_world.h"
#include "runtime/mpi_process.h"
#include "runtime/nccl_communicator.h"
#include "runtime/process_world.h"
#include "runtime/rank_resources.h"

namespace zest::detail {

void run_cuda_process_rank(const WorldOptions& options, const DetectedWorld& world,
                           const std::function<void(RankContext&)>& work) {
  const int rank = world.rank;
  std::optional<Error> communicator_failure;
  try {
    const int gpu = cuda::select_device(world.local_rank);
    cuda::CudaDevice device(gpu, options.device_memory, options.host_memory);
    auto communicator =
        NcclCommunicator::create_for_process(MpiProcess::get(), gpu, options.timeout);
    RankResources resources(rank, world.size, device, *communicator, options);
    RankContext& context = resources.context();
    try {
      work(context);
      context.synchronize();
    } catch (const std::exception& error) {
      // The watchdog's own failure (a timeout naming the collective) is the cause; what the
      // streams raised may only echo it.
      communicator_failure = communicator->failure();
      // Its queued collectives would wait for peers that are about to be ended: aborting makes
      // them exit, so the streams drain before the job ends.
      communicator->abort("rank " + std::to_string(rank) + " failed: " + error.what());
      throw;
    }
  } catch (const std::exception& error) {
    const Error failure =
        with_context(cause_of(error, communicator_failure), "rank " + std::to_string(rank));
    if (world.size == 1) raise(failure);
    end_job(options, failure);
  }
}

}  // namespace zest::detail
