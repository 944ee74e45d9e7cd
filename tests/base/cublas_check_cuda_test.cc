// ctest-labels: gpu
// ZEST_CUBLAS_CHECK's error: the call's text, cuBLAS's name for the status, file and line, and
// OutOfMemory for an allocation failure. Needs no GPU (cuBLAS's status names are host tables),
// so it runs wherever CUDA is built, with the gpu suites.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "base/cublas_check.h"
#include "base/error.h"

namespace zest::cuda {
namespace {

using ::testing::HasSubstr;

cublasStatus_t returns(cublasStatus_t status) { return status; }

TEST(CublasCheck, FailureNamesTheCallStatusFileAndLine) {
  const int line = __LINE__ + 2;
  try {
    ZEST_CUBLAS_CHECK(returns(CUBLAS_STATUS_INVALID_VALUE));
    ADD_FAILURE() << "expected a zest::Error";
  } catch (const OutOfMemory&) {
    ADD_FAILURE() << "an invalid value is not an out-of-memory";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kDevice);
    EXPECT_THAT(error.what(), HasSubstr("returns(CUBLAS_STATUS_INVALID_VALUE)"));
    EXPECT_THAT(error.what(), HasSubstr("failed: CUBLAS_STATUS_INVALID_VALUE"));
    EXPECT_THAT(error.what(), HasSubstr("cublas_check_cuda_test.cc:" + std::to_string(line)));
  }
}

TEST(CublasCheck, AllocationFailureIsOutOfMemory) {
  EXPECT_THROW(ZEST_CUBLAS_CHECK(returns(CUBLAS_STATUS_ALLOC_FAILED)), OutOfMemory);
  EXPECT_NO_THROW(ZEST_CUBLAS_CHECK(returns(CUBLAS_STATUS_SUCCESS)));
}

}  // namespace
}  // namespace zest::cuda
