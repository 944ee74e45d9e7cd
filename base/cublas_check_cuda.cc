#include <string>

#include "base/cublas_check.h"
#include "base/error.h"

namespace zest::cuda {

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  // Note: cublasGetStatusName / String are host-side tables; they need no GPU and no handle, so
  // an error raised before any device exists still says what it was.
  std::string message = std::string("cuBLAS call ") + call +
                        " failed: " + cublasGetStatusName(status) + " (" +
                        cublasGetStatusString(status) + ") at " + file + ":" + std::to_string(line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(std::move(message));
  throw Error(ErrorKind::kDevice, std::move(message));
}

}  // namespace zest::cuda
