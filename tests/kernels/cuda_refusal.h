// What every kernel's dispatch owes a stream that says CUDA but is not a CudaStream: a kUsage
// Error naming the kernel, on the host, before anything is enqueued or launched. The message
// depends on the build (a CUDA build finds no CudaStream to launch on; a CPU-only build has no
// CUDA body), so the check lives here once.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "tests/support/fake_cuda_stream.h"

namespace zest::testing {

inline std::string cuda_refusal_message(const std::string& kernel) {
#if ZEST_HAVE_CUDA
  return kernel + ": stream 'fake-cuda' is not a CUDA stream";
#else
  return kernel + ": no CUDA body yet";
#endif
}

// Runs call(stream) on a FakeCudaStream and expects the refusal of `kernel`.
template <typename Call>
void expect_cuda_stream_refused(const std::string& kernel, Call&& call) {
  SCOPED_TRACE(kernel);
  FakeCudaStream stream;
  try {
    call(stream);
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUsage);
    EXPECT_EQ(std::string(error.what()), cuda_refusal_message(kernel));
  }
  EXPECT_EQ(stream.enqueued, 0);
}

}  // namespace zest::testing
