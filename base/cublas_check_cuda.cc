#include <string>

#include "base/cublas_check.h"
#include "base/cublaslt_library.h"
#include "base/error.h"

namespace zest::cuda {

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  // Note: cuBLASLt's status names are host-side tables; they need no GPU and no handle, so an
  // error raised before any device exists still says what it was. Where the library itself
  // cannot be opened, the status's number stands in.
  std::string name;
  std::string text;
  try {
    name = cublaslt().status_name(status);
    text = cublaslt().status_string(status);
  } catch (const Error&) {
    name = "cublasStatus_t " + std::to_string(static_cast<int>(status));
    text = "cuBLASLt could not be opened to name it";
  }
  std::string message = std::string("cuBLAS call ") + call + " failed: " + name + " (" + text +
                        ") at " + file + ":" + std::to_string(line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(std::move(message));
  throw Error(ErrorKind::kDevice, std::move(message));
}

}  // namespace zest::cuda
