#include "base/cuda_check.h"

#include <string>

#include "base/error.h"

namespace zest::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // Note: a failing runtime call also leaves its status in CUDA's last-error slot; clearing it
  // keeps a later cudaGetLastError() (the check after each kernel launch) from blaming the
  // launch. A sticky error (a fault in a kernel) stays in the context whatever we clear.
  (void)cudaGetLastError();
  std::string message = std::string("CUDA call ") + call + " failed: " + cudaGetErrorName(status) +
                        " (" + cudaGetErrorString(status) + ") at " + file + ":" +
                        std::to_string(line);
  if (status == cudaErrorMemoryAllocation) throw OutOfMemory(std::move(message));
  throw Error(ErrorKind::kDevice, std::move(message));
}

}  // namespace zest::cuda
