// Turns the status of an NCCL call into a zest Error naming the call, NCCL's text for the status
// (and NCCL's own last-error detail where it has one), and the file and line of the call, in the
// style of ZEST_CUDA_CHECK (base/cuda_check.h). ncclRemoteError (a peer process exited, or the
// network failed) becomes kPeerFailure, anything else kDevice. ncclInProgress is not a failure:
// zest's communicators are nonblocking, and their calls return it while NCCL completes them in
// the background (nccl_comm.h polls for the end). Private to the NCCL backend: include it only
// from *_cuda.cc sources, since it includes <nccl.h>, which no public header may.
#pragma once

#ifndef ZEST_HAVE_CUDA
#error "runtime/nccl_check.h is CUDA-side only; include it where ZEST_HAVE_CUDA is defined"
#endif

#include <nccl.h>

#include <string>

#include "base/error.h"

// Note: zest's communicators are nonblocking (fault tolerance: a hung peer must not hang the
// host thread inside an NCCL call), use ncclAvg (2.14 and later for both) and are split into
// groups with ncclCommSplit (node, replica and pipeline groups: 2.18 and later).
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "zest needs NCCL 2.18 or later (nonblocking communicators, ncclAvg, ncclCommSplit)"
#endif

namespace zest::nccl {

// NCCL's text for `status`, its number, and NCCL's last-error detail where it has one (for
// `comm`, which may be null): "remote process exited or there was a network error
// (ncclResult_t 6) [NCCL: ...]".
std::string status_text(ncclResult_t status, ncclComm_t comm = nullptr);

// The kind of Error a failed status is: kPeerFailure for ncclRemoteError, else kDevice.
ErrorKind error_kind(ncclResult_t status);

// Throws the Error for `status` (neither ncclSuccess nor ncclInProgress). `call` is the call's
// text, `file` and `line` where it was made; `comm` (may be null) names the communicator whose
// last-error detail to add.
[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, const char* file,
                                   int line, ncclComm_t comm = nullptr);

// Throws for any status but ncclSuccess and ncclInProgress; returns the status.
inline ncclResult_t check(ncclResult_t status, const char* call, const char* file, int line) {
  if (status != ncclSuccess && status != ncclInProgress) {
    throw_nccl_error(status, call, file, line);
  }
  return status;
}

}  // namespace zest::nccl

// Checks an NCCL call (or an ncclResult_t value); records the call's text, file and line.
#define ZEST_NCCL_CHECK(call) ::zest::nccl::check((call), #call, __FILE__, __LINE__)
