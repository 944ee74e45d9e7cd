// The CUDA side of World: ranks on GPUs, one each, connected by NCCL (the `nccl` backend).
// Internal to World (world.cc calls it; nothing else should). Threads of one process take GPUs
// 0..n-1 (runtime/cuda_world_cuda.cc); a process of an MPI job takes the GPU of its local rank
// and gets NCCL's unique id over MPI (runtime/cuda_world_mpi_cuda.cc). Built only with CUDA.
#pragma once

#include <functional>

#include "runtime/world.h"
#include "runtime/world_detection.h"

namespace zest::detail {

// Runs `work` once per rank, each a thread with its own GPU, streams and NCCL communicator, and
// joins them; throws the first failure as "rank R: ...". A failing rank aborts its peers'
// communicators, so that none waits for it until the timeout.
void run_cuda_threads(const WorldOptions& options, const std::function<void(RankContext&)>& work);

#if ZEST_HAVE_MPI
// Runs `work` for this process's rank on the GPU of its local rank. A failure with more than
// one process prints "<program>: error: rank R: ..." and ends the job (MPI_Abort).
void run_cuda_process_rank(const WorldOptions& options, const DetectedWorld& world,
                           const std::function<void(RankContext&)>& work);
#endif

}  // namespace zest::detail
