#include "runtime/nccl_check.h"

namespace zest::nccl {

std::string status_text(ncclResult_t status, ncclComm_t comm) {
  std::string text = std::string(ncclGetErrorString(status)) + " (ncclResult_t " +
                     std::to_string(static_cast<int>(status)) + ")";
  // Note: NCCL's last error says which check inside NCCL failed ("peer 3 closed the
  // connection", "invalid device pointer"), which the status alone does not; it may be older
  // than this call, so it is shown as detail, not as the cause.
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') text += std::string(" [NCCL: ") + detail + "]";
  return text;
}

ErrorKind error_kind(ncclResult_t status) {
  return status == ncclRemoteError ? ErrorKind::kPeerFailure : ErrorKind::kDevice;
}

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line,
                      ncclComm_t comm) {
  throw Error(error_kind(status), std::string("NCCL call ") + call +
                                      " failed: " + status_text(status, comm) + " at " + file +
                                      ":" + std::to_string(line));
}

}  // namespace zest::nccl
