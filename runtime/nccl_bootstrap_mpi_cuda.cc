// NcclCommunicator::create_for_process: ranks as processes of an MPI job. Built only with both
// CUDA and MPI (the _mpi_cuda.cc suffix; see CMakeLists.txt).
#include <mpi.h>

#include <chrono>
#include <thread>
#include <utility>

#include "base/error.h"
#include "runtime/mpi_check.h"
#include "runtime/mpi_process.h"
#include "runtime/nccl_check.h"
#include "runtime/nccl_comm.h"
#include "runtime/nccl_communicator.h"

namespace zest {

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_for_process(
    MpiProcess& process, int device, std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    throw Error(ErrorKind::kUsage, "the NCCL communicator's timeout must be positive");
  }
  ncclUniqueId id{};
  if (process.rank() == 0) ZEST_NCCL_CHECK(ncclGetUniqueId(&id));
  // Note: a nonblocking broadcast polled against the timeout, so a rank 0 that never gets here
  // is an error naming what was awaited, not a hang. MPI cannot cancel the broadcast; the job is
  // ended after such an error anyway (World ends it with MPI_Abort).
  MPI_Request request = MPI_REQUEST_NULL;
  ZEST_MPI_CHECK(MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD, &request));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int done = 0;;) {
    ZEST_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw Error(ErrorKind::kCommTimeout,
                  "rank " + std::to_string(process.rank()) +
                      ": the NCCL unique id did not arrive from rank 0 within " +
                      nccl::seconds_text(timeout) +
                      "; every process must create its NCCL communicator (world.timeout_s sets "
                      "the limit)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ncclComm_t comm = nullptr;
  {
    nccl::DeviceScope scope(device);
    ncclConfig_t config = nccl::nonblocking_config();
    ZEST_NCCL_CHECK(ncclCommInitRankConfig(&comm, process.size(), id, process.rank(), &config));
  }
  return std::make_unique<NcclCommunicator>(
      std::make_unique<nccl::GuardedComm>(comm, process.rank(), process.size(), device, timeout));
}

}  // namespace zest
